"""kinfolk's plug-ins to other libraries: the ATLANTIS scoring pipeline that writes SFT weights
(`kinfolk.plugins.atlantis`), the ATLAS PEFT tuner (`kinfolk.plugins.atlas`) and the ADAPT merge utility
(`kinfolk.plugins.adapt`)."""
