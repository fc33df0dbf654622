import dataclasses
import json

import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.sites import load_site


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


def test_a_new_model_trains_the_residual_unet_and_an_old_one_resumes_its_generator():
    """The default body is the residual U-Net at 1e-3 without dropout (docs/recipe.md's body
    comparison); a model saved with the generator resumes as the generator at its own rate and
    dropout, whatever the defaults now are."""
    assert (TrainConfig().arch, TrainConfig().dropout, TrainConfig().learning_rate) == ("resunet", 0.0, 1e-3)
    saved = TrainConfig(filters=8, resolution=32, arch="generator", dropout=0.2, learning_rate=2e-4)
    resumed, changes = TrainConfig(filters=8, resolution=32).resume(saved, given=set())
    assert (resumed.arch, resumed.dropout, resumed.learning_rate, changes) == ("generator", 0.2, 2e-4, [])


def test_a_resume_takes_the_saved_recipe_and_architecture_where_no_flag_is_given():
    saved = TrainConfig(filters=4, resolution=32, epochs=3, loss="mae", augment="none", norm="batch", beams=0,
                        prescription_channel=False, learning_rate=1e-3, seed=3)
    config, changes = TrainConfig(epochs=10, keep=1).resume(saved, given={"epochs", "keep"})
    assert changes == [] and config.keep == 1 and config.epochs == 10
    assert config == dataclasses.replace(saved, epochs=10, keep=1)
    config, _ = TrainConfig().resume(saved, given=set())  # the bare command: the saved run, to its saved epochs
    assert config == saved


def test_a_site_file_edited_since_the_model_was_trained_is_refused_naming_the_field_that_differs():
    site = load_site("prostate").to_dict()
    site["name"] = "pelvis"
    saved = TrainConfig(site=site, filters=4, resolution=32)
    site["structures"][5]["prescription_gy"] = 80  # the file edited in place: the same name
    with pytest.raises(ConfigError, match=r"site: saved 'pelvis', requested 'pelvis' \(the site file differs: "
                                          r"structures\[5\].prescription_gy 78 -> 80\)"):
        TrainConfig(site=site, filters=4, resolution=32).resume(saved, given={"site"})


def test_a_resume_refuses_a_given_recipe_flag_that_differs_naming_each_field():
    saved = TrainConfig(filters=4, resolution=32, loss="mae", augment="none", learning_rate=2e-4)
    requested = TrainConfig(filters=4, resolution=32, loss="masked-mae", augment="flip", learning_rate=2e4)
    with pytest.raises(ConfigError, match=r"with another recipe \(loss: saved 'mae', requested 'masked-mae'; augment: "
                                          r"saved 'none', requested 'flip'; learning_rate: saved 0.0002, requested "
                                          r"20000.0\).*--change-recipe"):
        requested.resume(saved, given={"loss", "augment", "learning_rate"})
    requested.resume(saved, given=set())  # not given: the saved values, no refusal
    with pytest.raises(ConfigError, match="filters: saved 4, requested 8"):  # architecture: even with --change-recipe
        TrainConfig(filters=8, resolution=32).resume(saved, given={"filters"}, change_recipe=True)


def test_a_recipe_change_with_change_recipe_is_applied_and_recorded_in_the_history():
    saved = TrainConfig(filters=4, resolution=32, learning_rate=2e-4)
    config, changes = TrainConfig(filters=4, resolution=32, learning_rate=1e-4, loss="mae").resume(
        saved, given={"learning_rate", "loss"}, change_recipe=True)
    assert (config.learning_rate, config.loss) == (1e-4, "mae")
    config = config.with_changes_recorded(changes, first_epoch=7)
    again = TrainConfig.from_json(config.to_json())
    assert again.history == ({"epoch": 7, "field": "loss", "from": "masked-mae", "to": "mae"},
                             {"epoch": 7, "field": "learning_rate", "from": 2e-4, "to": 1e-4})
    assert again.loss_changed_at() == 7 and saved.loss_changed_at() == 1
    resumed, changes = TrainConfig().resume(again, given=set())  # the next bare resume keeps both
    assert changes == [] and resumed.history == again.history and resumed.learning_rate == 1e-4


def test_toggling_ema_on_a_resume_is_refused_even_with_change_recipe():
    for before, after in ((False, True), (True, False)):
        with pytest.raises(ConfigError, match=f"with --{'' if after else 'no-'}ema: .*cannot be turned "
                                              f"{'on' if after else 'off'} on a resume, not even with --change-recipe"):
            TrainConfig(ema=after).resume(TrainConfig(ema=before), given={"ema"}, change_recipe=True)


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


def test_a_resume_on_another_site_is_refused_naming_both_by_name():
    with pytest.raises(ConfigError, match=r"site: saved 'openkbp', requested 'prostate'"):
        TrainConfig(site="prostate").resume(TrainConfig(), given={"site"})


def test_a_model_saved_before_optional_targets_takes_todays_shipped_site():
    """A config.json written before sites said which targets a patient may lack has OpenKBP's site
    without `required`: it is the shipped site (PTV56 and PTV63 optional), not a site whose every
    target is required (a patient without PTV63 would be refused by that model's import)."""
    saved = json.loads(TrainConfig().to_json())
    for structure in saved["site"]["structures"]:
        structure.pop("required", None)
    restored = TrainConfig.from_json(json.dumps(saved))
    assert restored.site is load_site("openkbp") and restored.site.required_targets == ("PTV70",)


def test_a_resume_refuses_another_init_from_and_keeps_where_the_weights_started(tmp_path):
    parent, other = tmp_path / "p", tmp_path / "q"
    saved = TrainConfig(init_from=str(parent), init_epoch=4, parent={"model": "p", "epoch": 4, "folder": str(parent)})
    with pytest.raises(ConfigError, match=rf"with --init-from {other} \(--init-epoch 4\): it started from 'p' "
                                          rf"\(epoch 4\), and a resume continues from its own checkpoints") as refused:
        TrainConfig(init_from=str(other), init_epoch=4).resume(saved, given={"init_from", "init_epoch"})
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"\(--init-epoch best\): it started from 'p' \(epoch 4\)"):
        TrainConfig(init_from=str(parent)).resume(saved, given={"init_from"})  # the same parent, another checkpoint
    for command in (TrainConfig(), TrainConfig(init_from=str(parent / "." / ""), init_epoch=4)):  # bare, or the same
        config, _ = command.resume(saved, given={"init_from", "init_epoch"} if command.init_from else set())
        assert (config.init_from, config.init_epoch, config.parent) == (str(parent), 4, saved.parent)
    with pytest.raises(ConfigError, match="it started from random weights"):
        TrainConfig(init_from=str(parent)).resume(TrainConfig(), given={"init_from"})
    assert TrainConfig.from_json(saved.to_json()) == saved


def test_freezing_a_batch_normalised_encoder_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"Invalid `freeze`. Expected none with --norm batch \(batch "
                                          r"normalisation's moving statistics .*Received: freeze='encoder'"):
        TrainConfig(norm="batch", freeze="encoder", freeze_epochs=2)
    assert TrainConfig(norm="instance", freeze="encoder", freeze_epochs=2).freeze == "encoder"


def test_a_new_model_from_a_parent_takes_its_network_where_no_flag_is_given_and_its_own_sites_beams():
    parent = TrainConfig(filters=8, resolution=64, norm="batch", prescription_channel=False, dropout=0.1,
                         beam_channels="each", folds=5, fold=2)
    config, taken = TrainConfig(filters=16).with_parents_network(parent, given={"filters"})
    assert (config.filters, config.resolution, config.norm, config.prescription_channel, config.dropout,
            config.beam_channels, config.folds) == (16, 64, "batch", False, 0.1, "each", 0)
    assert taken == ["resolution", "dropout", "norm", "prescription_channel", "beam_channels"]
    prostate = load_site("prostate")
    config, _ = TrainConfig(site=prostate).with_parents_network(parent, given={"site"})
    assert config.site.same_as(prostate) and config.gantry_angles == prostate.beams.gantry_angles()
    assert config.filters == 8
    no_beams = dataclasses.replace(parent, beams=0, beam_angles="")
    assert TrainConfig().with_parents_network(no_beams, given=set())[0].beams == 0  # the same site: the parent's
    assert TrainConfig(filters=16).with_parents_network(parent, given=None) == (TrainConfig(filters=16), [])


def test_the_body_and_the_physics_channel_are_architecture_a_resume_cannot_change():
    saved = TrainConfig(filters=8, resolution=32, arch="resunet", physics=True)
    assert TrainConfig.from_json(saved.to_json()) == saved
    with pytest.raises(ConfigError, match="arch: saved 'resunet', requested 'generator'"):
        TrainConfig(filters=8, resolution=32, arch="generator", physics=True).resume(saved, given={"arch"})
    with pytest.raises(ConfigError, match="physics: saved True, requested False"):
        TrainConfig(filters=8, resolution=32, arch="resunet").resume(saved, given={"physics"})
    resumed, _ = TrainConfig(filters=8, resolution=32).resume(saved, given=set())  # the bare command
    assert (resumed.arch, resumed.physics) == ("resunet", True)
    with pytest.raises(ConfigError, match="Invalid `arch`"):
        TrainConfig(arch="transformer")
