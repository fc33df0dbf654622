"""The admission of a run (training/admission.py): what a resume takes from the saved run and may
change, what a model started from a parent takes of its network."""

import dataclasses

import pytest

from provided_code.config import ConfigError, TrainConfig
from provided_code.sites import load_site
from provided_code.training.admission import (
    check_resume,
    loss_changed_at,
    resume,
    with_changes_recorded,
    with_parents_network,
)


def test_a_resume_check_refuses_another_architecture_or_precision():
    config = TrainConfig(filters=8, resolution=32, epochs=3)
    check_resume(TrainConfig(filters=8, resolution=32, epochs=10, learning_rate=1e-3), config)
    with pytest.raises(ConfigError, match="filters: saved 8, requested 16"):
        check_resume(TrainConfig(filters=16, resolution=32), config)
    with pytest.raises(ConfigError, match="precision"):
        check_resume(TrainConfig(filters=8, resolution=32, precision="mixed_float16"), config)


def test_a_new_model_trains_the_residual_unet_and_an_old_one_resumes_its_generator():
    """The default body is the residual U-Net at 1e-3 without dropout (docs/recipe.md's body
    comparison); a model saved with the generator resumes as the generator at its own rate and
    dropout, whatever the defaults now are."""
    assert (TrainConfig().arch, TrainConfig().dropout, TrainConfig().learning_rate) == ("resunet", 0.0, 1e-3)
    saved = TrainConfig(filters=8, resolution=32, arch="generator", dropout=0.2, learning_rate=2e-4)
    resumed, changes = resume(TrainConfig(filters=8, resolution=32), saved, given=set())
    assert (resumed.arch, resumed.dropout, resumed.learning_rate, changes) == ("generator", 0.2, 2e-4, [])


def test_a_resume_takes_the_saved_recipe_and_architecture_where_no_flag_is_given():
    saved = TrainConfig(filters=4, resolution=32, epochs=3, loss="mae", augment="none", norm="batch", beams=0,
                        prescription_channel=False, learning_rate=1e-3, seed=3)
    config, changes = resume(TrainConfig(epochs=10, keep=1), saved, given={"epochs", "keep"})
    assert changes == [] and config.keep == 1 and config.epochs == 10
    assert config == dataclasses.replace(saved, epochs=10, keep=1)
    config, _ = resume(TrainConfig(), saved, given=set())  # the bare command: the saved run, to its saved epochs
    assert config == saved


def test_a_site_file_edited_since_the_model_was_trained_is_refused_naming_the_field_that_differs():
    site = load_site("prostate").to_dict()
    site["name"] = "pelvis"
    saved = TrainConfig(site=site, filters=4, resolution=32)
    site["structures"][5]["prescription_gy"] = 80  # the file edited in place: the same name
    with pytest.raises(ConfigError, match=r"site: saved 'pelvis', requested 'pelvis' \(the site file differs: "
                                          r"structures\[5\].prescription_gy 78 -> 80\)"):
        resume(TrainConfig(site=site, filters=4, resolution=32), saved, given={"site"})


def test_a_resume_refuses_a_given_recipe_flag_that_differs_naming_each_field():
    saved = TrainConfig(filters=4, resolution=32, loss="mae", augment="none", learning_rate=2e-4)
    requested = TrainConfig(filters=4, resolution=32, loss="masked-mae", augment="flip", learning_rate=2e4)
    with pytest.raises(ConfigError, match=r"with another recipe \(loss: saved 'mae', requested 'masked-mae'; augment: "
                                          r"saved 'none', requested 'flip'; learning_rate: saved 0.0002, requested "
                                          r"20000.0\).*--change-recipe"):
        resume(requested, saved, given={"loss", "augment", "learning_rate"})
    resume(requested, saved, given=set())  # not given: the saved values, no refusal
    with pytest.raises(ConfigError, match="filters: saved 4, requested 8"):  # architecture: even with --change-recipe
        resume(TrainConfig(filters=8, resolution=32), saved, given={"filters"}, change_recipe=True)


def test_a_recipe_change_with_change_recipe_is_applied_and_recorded_in_the_history():
    saved = TrainConfig(filters=4, resolution=32, learning_rate=2e-4)
    config, changes = resume(TrainConfig(filters=4, resolution=32, learning_rate=1e-4, loss="mae"), saved,
                             given={"learning_rate", "loss"}, change_recipe=True)
    assert (config.learning_rate, config.loss) == (1e-4, "mae")
    config = with_changes_recorded(config, changes, first_epoch=7)
    again = TrainConfig.from_json(config.to_json())
    assert again.history == ({"epoch": 7, "field": "loss", "from": "masked-mae", "to": "mae"},
                             {"epoch": 7, "field": "learning_rate", "from": 2e-4, "to": 1e-4})
    assert loss_changed_at(again) == 7 and loss_changed_at(saved) == 1
    resumed, changes = resume(TrainConfig(), again, given=set())  # the next bare resume keeps both
    assert changes == [] and resumed.history == again.history and resumed.learning_rate == 1e-4


def test_toggling_ema_on_a_resume_is_refused_even_with_change_recipe():
    for before, after in ((False, True), (True, False)):
        with pytest.raises(ConfigError, match=f"with --{'' if after else 'no-'}ema: .*cannot be turned "
                                              f"{'on' if after else 'off'} on a resume, not even with --change-recipe"):
            resume(TrainConfig(ema=after), TrainConfig(ema=before), given={"ema"}, change_recipe=True)


def test_a_resume_on_another_site_is_refused_naming_both_by_name():
    with pytest.raises(ConfigError, match=r"site: saved 'openkbp', requested 'prostate'"):
        resume(TrainConfig(site="prostate"), TrainConfig(), given={"site"})


def test_a_resume_refuses_another_init_from_and_keeps_where_the_weights_started(tmp_path):
    parent, other = tmp_path / "p", tmp_path / "q"
    saved = TrainConfig(init_from=str(parent), init_epoch=4, parent={"model": "p", "epoch": 4, "folder": str(parent)})
    with pytest.raises(ConfigError, match=rf"with --init-from {other} \(--init-epoch 4\): it started from 'p' "
                                          rf"\(epoch 4\), and a resume continues from its own checkpoints") as refused:
        resume(TrainConfig(init_from=str(other), init_epoch=4), saved, given={"init_from", "init_epoch"})
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"\(--init-epoch best\): it started from 'p' \(epoch 4\)"):
        resume(TrainConfig(init_from=str(parent)), saved, given={"init_from"})  # the same parent, another checkpoint
    for command in (TrainConfig(), TrainConfig(init_from=str(parent / "." / ""), init_epoch=4)):  # bare, or the same
        config, _ = resume(command, saved, given={"init_from", "init_epoch"} if command.init_from else set())
        assert (config.init_from, config.init_epoch, config.parent) == (str(parent), 4, saved.parent)
    with pytest.raises(ConfigError, match="it started from random weights"):
        resume(TrainConfig(init_from=str(parent)), TrainConfig(), given={"init_from"})
    assert TrainConfig.from_json(saved.to_json()) == saved


def test_a_new_model_from_a_parent_takes_its_network_where_no_flag_is_given_and_its_own_sites_beams():
    parent = TrainConfig(filters=8, resolution=64, norm="batch", prescription_channel=False, dropout=0.1,
                         beam_channels="each", folds=5, fold=2)
    config, taken = with_parents_network(TrainConfig(filters=16), parent, given={"filters"})
    assert (config.filters, config.resolution, config.norm, config.prescription_channel, config.dropout,
            config.beam_channels, config.folds) == (16, 64, "batch", False, 0.1, "each", 0)
    assert taken == ["resolution", "dropout", "norm", "prescription_channel", "beam_channels"]
    prostate = load_site("prostate")
    config, _ = with_parents_network(TrainConfig(site=prostate), parent, given={"site"})
    assert config.site.same_as(prostate) and config.gantry_angles == prostate.beams.gantry_angles()
    assert config.filters == 8
    no_beams = dataclasses.replace(parent, beams=0, beam_angles="")
    assert with_parents_network(TrainConfig(), no_beams, given=set())[0].beams == 0  # the same site: the parent's
    assert with_parents_network(TrainConfig(filters=16), parent, given=None) == (TrainConfig(filters=16), [])


def test_the_body_and_the_physics_channel_are_architecture_a_resume_cannot_change():
    saved = TrainConfig(filters=8, resolution=32, arch="resunet", physics=True)
    assert TrainConfig.from_json(saved.to_json()) == saved
    with pytest.raises(ConfigError, match="arch: saved 'resunet', requested 'generator'"):
        resume(TrainConfig(filters=8, resolution=32, arch="generator", physics=True), saved, given={"arch"})
    with pytest.raises(ConfigError, match="physics: saved True, requested False"):
        resume(TrainConfig(filters=8, resolution=32, arch="resunet"), saved, given={"physics"})
    resumed, _ = resume(TrainConfig(filters=8, resolution=32), saved, given=set())  # the bare command
    assert (resumed.arch, resumed.physics) == ("resunet", True)
    with pytest.raises(ConfigError, match="Invalid `arch`"):
        TrainConfig(arch="transformer")
