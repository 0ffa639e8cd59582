"""The project's scripts (the demo's results table, the soak, the probes): each runs from the checkout's root as
`python -m scripts.<name>`."""
