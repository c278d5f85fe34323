"""npugraph_ex.configs: ``compiler_config.CompilerConfig`` and ``_process_kwargs_options``."""
