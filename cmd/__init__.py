"""The `waypoint` command line and its quickstart chapters."""
