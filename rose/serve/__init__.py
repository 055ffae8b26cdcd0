"""Serving side of ROSE: trace replay against serving endpoints."""
