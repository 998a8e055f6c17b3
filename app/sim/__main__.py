"""`python -m app.sim` runs the sim (same flags as `kvgate sim`)."""

from app.sim.cli import main

raise SystemExit(main())
