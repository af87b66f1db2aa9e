"""Model files: the CPU OM container, ATC OM detection, ATC and compile."""
