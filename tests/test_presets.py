"""--preset: documented sets of recipe and network choices; explicit flags override them."""

import dataclasses

import pytest
from click.testing import CliRunner

import provided_code.apps.cli as cli
from provided_code.config import TrainConfig, field_defaults
from provided_code.errors import UserError
from provided_code.presets import FINETUNE_FIELDS, PRESET_FIELDS, PRESETS, apply_preset, preset_network

# What the default recipe trained before --preset existed (the README's comparison chose it).
V1 = {"arch": "generator", "widths": "1,2,4,8,8,8", "head": "relu", "dropout": 0.2, "learning_rate": 2e-4, "physics": False, "loss": "masked-mae", "augment": "flip", "lr_schedule": "constant", "warmup_epochs": 0, "ema": False,
      "norm": "batch", "prescription_channel": False, "beams": 0, "beam_angles": "", "beam_channels": "count",
      "dvh_weight": 0.0}


def test_v1_resolves_to_the_old_defaults_default_to_todays_and_starter_to_the_2020_recipe():
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    assert all(set(PRESETS[name]) == set(PRESET_FIELDS) <= fields for name in ("starter", "v1", "v2", "default"))
    defaults = field_defaults()
    v1 = TrainConfig(**apply_preset("v1", defaults, given=set()))
    assert {field: getattr(v1, field) for field in PRESET_FIELDS} == V1 == PRESETS["v1"]
    assert v1 == TrainConfig(**{**defaults, **V1})  # nothing else moves
    assert TrainConfig(**apply_preset("default", defaults, given=set())) == TrainConfig()
    assert TrainConfig(**apply_preset("default", {**defaults, "beams": 0}, given={"beams"})).beams == 0
    starter = TrainConfig(**apply_preset("starter", defaults, given=set()))
    assert (starter.loss, starter.augment, starter.lr_schedule, starter.norm) == ("mae", "none", "constant", "batch")
    kept = apply_preset("starter", {**defaults, "loss": "masked-mae"}, given={"loss"})
    assert kept["loss"] == "masked-mae" and kept["augment"] == "none"


@pytest.fixture
def resolved_configs(monkeypatch) -> list:
    """The configs the command line resolves, captured as it makes them, before it does any work (it
    then exits 1)."""
    seen = []

    class Stop(UserError):
        pass

    def capture(**settings):
        seen.append(TrainConfig(**settings))
        raise Stop("stopped before any work")

    monkeypatch.setattr(cli, "TrainConfig", capture)
    return seen


def test_the_command_line_applies_the_preset_under_explicit_flags(resolved_configs):
    seen = resolved_configs
    result = CliRunner().invoke(cli.main, ["--preset", "starter", "--augment", "flip", "--norm", "instance"])
    assert result.exit_code == 1 and "stopped before any work" in result.output
    config = seen[0]
    assert (config.loss, config.augment, config.norm, config.lr_schedule) == ("mae", "flip", "instance", "constant")
    with pytest.raises(UserError, match="Invalid `preset`"):
        apply_preset("best", {}, set())


def test_the_command_line_without_flags_trains_the_defaults_and_every_default_can_be_turned_off(resolved_configs):
    seen = resolved_configs
    for args in ([], ["--preset", "default"]):
        assert CliRunner().invoke(cli.main, args).exit_code == 1
        assert seen.pop() == TrainConfig()
    CliRunner().invoke(cli.main, ["--arch", "generator", "--dropout", "0.2", "--learning-rate", "2e-4",
                                  "--no-prescription-channel", "--beams", "0", "--norm", "batch",
                                  "--lr-schedule", "constant"])
    assert seen.pop() == TrainConfig(**{**field_defaults(), **V1})


def test_finetune_sets_the_recipe_and_leaves_the_network_to_the_parent(phantom_data, tmp_path, monkeypatch):
    """--preset finetune gives its recipe fields on purpose (a resume compares them) and no network
    field, so that a new model started with --init-from takes the parent's network."""
    import provided_code.training.train as training

    assert set(PRESETS["finetune"]) == set(FINETUNE_FIELDS) <= {field.name for field in dataclasses.fields(TrainConfig)}
    assert not set(FINETUNE_FIELDS) & set(TrainConfig.ARCHITECTURE)
    seen = []

    class Stop(UserError):
        pass

    def capture(config, given=None, **options):
        seen.append((config, given))
        raise Stop("stopped before any work")

    monkeypatch.setattr(training, "train", capture)
    result = CliRunner().invoke(cli.main, ["--preset", "finetune", "--init-from", str(tmp_path / "parent"),
                                           "--learning-rate", "3e-5", "--data-dir", str(phantom_data),
                                           "--results-dir", str(tmp_path / "results")])
    assert result.exit_code == 1 and "stopped before any work" in result.output
    config, given = seen[0]
    assert set(FINETUNE_FIELDS) | {"init_from"} <= given and not given & set(TrainConfig.ARCHITECTURE)
    assert config.learning_rate == 3e-5  # the flag over the preset
    assert {name: getattr(config, name) for name in FINETUNE_FIELDS if name != "learning_rate"} == {
        name: value for name, value in PRESETS["finetune"].items() if name != "learning_rate"}


def test_v2_is_the_generators_default_of_the_longer_comparison_byte_for_byte():
    """--preset v2 resolves to the defaults before --arch existed (the generator, instance norm, the
    prescription and beams' channels, cosine): the same config.json, whatever the defaults become."""
    v2 = TrainConfig(**apply_preset("v2", field_defaults(), given=set()))
    before = TrainConfig(arch="generator", dropout=0.2, physics=False, loss="masked-mae", augment="flip",
                         lr_schedule="cosine", norm="instance", prescription_channel=True, learning_rate=2e-4)
    assert v2.to_json() == before.to_json()
    assert (v2.arch, v2.beams, v2.beam_channels) == ("generator", 9, "count")
    assert v2 != TrainConfig()  # the default body is the residual U-Net's comparison's choice (docs/recipe.md)


def test_a_presets_network_is_the_network_its_whole_preset_builds_and_finetune_has_none():
    """preset_network: the fields that shape the weights, so a config made from them alone has the
    whole preset's network (the benchmarks build the generator this way)."""
    for name in ("starter", "v1", "v2", "default"):
        network = preset_network(name)
        assert set(network) <= set(TrainConfig.NETWORK) and "learning_rate" not in network
        whole = TrainConfig(**apply_preset(name, field_defaults(), given=set()))
        assert TrainConfig(**network).spec == whole.spec
    assert preset_network("finetune") == {}
