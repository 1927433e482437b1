"""How settings are typed, checked and spelt: options chosen by name, the kinds of values, the kinds that name classes."""
