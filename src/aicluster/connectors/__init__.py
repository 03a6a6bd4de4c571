"""pyinfra connectors of aicluster's own, registered under pyinfra's ``pyinfra.connectors``
entry point (pyproject.toml) and chosen per host by its name in the inventory."""
