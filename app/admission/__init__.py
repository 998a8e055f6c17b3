"""Fair admission under overload: saturation per pool, a virtual-token-counter queue in front of it."""

from app.admission.config import AdmissionConfig, ClassDeadlines
from app.admission.queue import AdmissionQueue, AdmissionRejected, Ticket
from app.admission.saturation import ReplicaLoad, Saturation, assess

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
