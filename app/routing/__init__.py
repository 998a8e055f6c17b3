"""Routing: classify a request (interactive | bulk), keep pool state fresh, and pick a replica."""
