"""kinfolk inside other training tools: each subpackage plugs kinfolk's methods into one tool and is the only place
that imports it (`kinfolk.integrations.axolotl`: axolotl's plugin system), so kinfolk without the tool is unaffected.
"""
