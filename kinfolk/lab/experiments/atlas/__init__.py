"""atlas (version 2 of the ATLAS question): protocol 2 over the committed version-1 runs (`experiment`)."""
