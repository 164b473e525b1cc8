"""atlantis (version 2 of the ATLANTIS question): protocol 2 over the committed version-1 runs (`experiment`)."""
