"""torchair.configs: ``compiler_config.CompilerConfig`` and the option values it is built from."""
