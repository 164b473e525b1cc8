"""adapt (version 2 of the ADAPT question): protocol 2 over the committed version-1 runs (`experiment`)."""
