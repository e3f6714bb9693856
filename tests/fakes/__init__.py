"""Stand-ins for the GPU and the compiler, importable by spawned child processes."""
