"""machine: the processes (distributed), the accelerator (hardware), the host's threads, files and memory, and the
memory estimate."""
