import pytest
from pydantic import ValidationError

from app.config.admission import AdmissionConfig


def test_defaults_are_on_with_two_tenants_with_the_documented_thresholds() -> None:
    cfg = AdmissionConfig()
    assert cfg.enabled is None and cfg.tenant_window_s == 60.0
    assert cfg.kv_usage_threshold == 0.95
    assert cfg.max_in_flight_tokens is None
    assert cfg.deadline_s.for_class("interactive") == 2.0
    assert cfg.deadline_s.for_class("bulk") == 30.0
    assert cfg.on_exceed == "reject"


def test_a_partial_deadline_keeps_the_other_class_default() -> None:
    cfg = AdmissionConfig.model_validate({"deadline_s": {"interactive": 0.5}})
    assert cfg.deadline_s.interactive == 0.5
    assert cfg.deadline_s.bulk == 30.0


def test_unlisted_tenants_get_the_default_weight() -> None:
    cfg = AdmissionConfig(tenant_weights={"acme": 3.0}, default_weight=0.5)
    assert cfg.weight("acme") == 3.0
    assert cfg.weight("other") == 0.5


@pytest.mark.parametrize("raw", [{"tenant_weights": {"a": 0}}, {"max_waiting_per_replica": 0},
                                 {"kv_usage_threshold": 1.5}, {"deadline_s": {"bulk": 0}}, {"typo": 1}])
def test_bad_values_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AdmissionConfig.model_validate(raw)
