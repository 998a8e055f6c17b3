"""Fair admission under overload: saturation per pool, a virtual-token-counter queue in front of it."""

from app.admission.queue import AdmissionQueue, AdmissionRejected, Ticket
from app.admission.saturation import ReplicaLoad, Saturation, assess
from app.config.admission import AdmissionConfig, ClassDeadlines

__all__ = [
    "AdmissionConfig",
    "AdmissionQueue",
    "AdmissionRejected",
    "ClassDeadlines",
    "ReplicaLoad",
    "Saturation",
    "Ticket",
    "assess",
]
