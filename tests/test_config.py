import json

import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.sites import load_site


def test_json_round_trip():
    config = TrainConfig(filters=8, resolution=32, epochs=3)
    assert TrainConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("field, value", [("filters", 0), ("epochs", -1), ("batch_size", 1.5),
                                          ("resolution", 48), ("precision", "half"),
                                          ("learning_rate", 0), ("model_name", "a/b"), ("keep", True),
                                          ("xla", "maybe"), ("accumulate", 0), ("collective_timeout", 0)])
def test_bad_settings_are_named(field, value):
    with pytest.raises(ConfigError, match=f"Invalid `{field}`.*Received: {field}="):
        TrainConfig(**{field: value})


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
    assert (old.arch, old.physics, old.spec.arch) == ("generator", False, "generator")  # before --arch, --physics
    assert (old.dropout, old.learning_rate) == (0.2, 2e-4)  # the generator's, before the residual U-Net's defaults
    assert set(ABSENT_MEANS) <= {field for field in TrainConfig.__dataclass_fields__}
    new = TrainConfig(filters=8, resolution=32, beams=9, norm="instance")
    assert TrainConfig.from_json(new.to_json()) == new


@pytest.mark.parametrize("field, value", [("learning_rate", float("inf")), ("learning_rate", float("nan")),
                                          ("dvh_weight", float("inf")), ("dvh_weight", float("nan"))])
def test_rates_and_weights_must_be_finite(field, value):
    with pytest.raises(ConfigError, match=f"Invalid `{field}`. Expected a finite number"):
        TrainConfig(**{field: value})


def test_a_warm_up_as_long_as_the_run_and_too_many_or_too_close_beams_are_concerns():
    assert TrainConfig(resolution=32).concerns() == []
    assert "the peak --learning-rate 0.001 is never reached" in TrainConfig(warmup_epochs=5, epochs=5).concerns()[0]
    (many,) = TrainConfig(beams=40, resolution=128).concerns()
    assert "40 beams: more than 36" in many
    assert len(TrainConfig(beams=1000, resolution=128).concerns()) == 2  # too many, and 0.36° apart
    (close,) = TrainConfig(beam_angles="0,2,180", resolution=32).concerns()
    assert "beams 2° apart: closer than a 32³ grid resolves" in close
    assert TrainConfig(beam_angles="0,2,180", resolution=128).concerns() == []


def test_the_whole_site_is_saved_and_a_config_without_one_is_openkbp():
    saved = json.loads(TrainConfig(site="prostate").to_json())
    assert saved["site"]["name"] == "prostate" and saved["site"]["structures"][-1]["prescription_gy"] == 78
    restored = TrainConfig.from_json(json.dumps(saved))
    assert restored.site == load_site("prostate") and restored.gantry_angles == load_site("prostate").beams.gantry_angles()
    assert restored.spec == TrainConfig(site="prostate").spec and restored.spec.site.name == "prostate"
    del saved["site"]
    assert TrainConfig.from_json(json.dumps(saved)).site.name == "openkbp"


def test_a_model_saved_before_optional_targets_takes_todays_shipped_site():
    """A config.json written before sites said which targets a patient may lack has OpenKBP's site
    without `required`: it is the shipped site (PTV56 and PTV63 optional), not a site whose every
    target is required (a patient without PTV63 would be refused by that model's import)."""
    saved = json.loads(TrainConfig().to_json())
    for structure in saved["site"]["structures"]:
        structure.pop("required", None)
    restored = TrainConfig.from_json(json.dumps(saved))
    assert restored.site is load_site("openkbp") and restored.site.required_targets == ("PTV70",)


def test_freezing_a_batch_normalised_encoder_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"Invalid `freeze`. Expected none with --norm batch \(batch "
                                          r"normalisation's moving statistics .*Received: freeze='encoder'"):
        TrainConfig(norm="batch", freeze="encoder", freeze_epochs=2)
    assert TrainConfig(norm="instance", freeze="encoder", freeze_epochs=2).freeze == "encoder"


