"""The HTTP surface: the ASGI app, the control endpoints and the inference endpoints."""
