"""What the lab's experiments share: each method's runs and measurements, and the selection rules.

Experiments (`kinfolk.lab.experiments`) import from here and from `world`/`protocol`, never from each other.
"""
