"""The ATLANTIS experiment under the protocol: `reanalysis` (protocol 2 over the committed version-1 runs)."""
