"""The built-in protocol library, one module per family or fitted method; a leaf that only
`colab_graphs.builtins` imports (registering every protocol). Look protocols up by name with
`colab_graphs.get_protocol` / `colab_graphs.protocol_registry`."""
