import pytest

from provided_code.config import ConfigError, TrainConfig


@pytest.mark.parametrize("field, value", [("filters", 0), ("epochs", -1), ("batch_size", 1.5),
                                          ("resolution", 48), ("precision", "half"),
                                          ("learning_rate", 0), ("model_name", "a/b"), ("keep", True),
                                          ("xla", "maybe"), ("accumulate", 0), ("collective_timeout", 0)])
def test_bad_settings_are_named(field, value):
    with pytest.raises(ConfigError, match=f"Invalid `{field}`.*Received: {field}="):
        TrainConfig(**{field: value})


def test_json_round_trip_and_resume_check():
    config = TrainConfig(filters=8, resolution=32, epochs=3)
    assert TrainConfig.from_json(config.to_json()) == config
    TrainConfig(filters=8, resolution=32, epochs=10, learning_rate=1e-3).check_resume(config)
    with pytest.raises(ConfigError, match="filters: saved 8, requested 16"):
        TrainConfig(filters=16, resolution=32).check_resume(config)
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(filters=8, resolution=32, precision="mixed_float16").check_resume(config)


def test_configs_saved_before_xla_modes_still_load():
    old = TrainConfig(filters=8, resolution=32).to_json().replace('"xla": "auto"', '"xla": false')
    assert TrainConfig.from_json(old).xla == "off"
    assert TrainConfig.from_json(old.replace("false", "true")).xla == "on"


def test_a_config_saved_before_a_setting_existed_loads_as_what_it_trained():
    """Settings added later (normalisation, inputs, averaging, DVH term) read as their old values,
    whatever today's defaults are, so an old model resumes and predicts with its own network."""
    import json

    from provided_code.config import ABSENT_MEANS

    old = TrainConfig.from_json(json.dumps({"filters": 8, "resolution": 32, "model_name": "old"}))
    assert (old.norm, old.prescription_channel, old.beams, old.beam_angles, old.ema, old.dvh_weight) == \
        ("batch", False, 0, "", False, 0.0)
    assert set(ABSENT_MEANS) <= {field for field in TrainConfig.__dataclass_fields__}
    new = TrainConfig(filters=8, resolution=32, beams=9, norm="instance")
    assert TrainConfig.from_json(new.to_json()) == new
