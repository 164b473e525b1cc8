"""kinfolk's plug-ins to other libraries: the ATLAS PEFT tuner (`kinfolk.plugins.atlas`) and the ADAPT merge
utility (`kinfolk.plugins.adapt`)."""
