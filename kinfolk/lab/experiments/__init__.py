"""One package per registered experiment (`kinfolk.lab.protocol.EXPERIMENTS`), named after it with `_` for `-`."""
