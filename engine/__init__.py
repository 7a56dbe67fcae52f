"""Waypoint engine."""
