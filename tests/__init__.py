"""flashtune's CPU test suite (a package, so that spawned worker and compile processes can import tests.fakes)."""
