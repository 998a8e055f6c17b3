"""The two-sim cluster behind a gateway (tests/routing/test_faults_e2e.py) serves the surface e2e tests too."""

from tests.routing.test_faults_e2e import cluster

__all__ = ["cluster"]
