"""``dfdl.space``: distributions check their bounds when made and become Optuna's."""

from __future__ import annotations

import pytest

import dfdl
from dfdl.errors import ConfigError
from dfdl.space import choice, intuniform, is_distribution, loguniform, to_optuna, uniform

optuna = pytest.importorskip("optuna")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: loguniform(0, 1), "low must be > 0"),
        (lambda: uniform(1, 1), "low must be below high"),
        (lambda: uniform(0, float("nan")), "high must be a finite number"),
        (lambda: uniform("a", 1), "low must be a finite number"),
        (lambda: intuniform(1, 4.5), "high must be an integer"),
        (lambda: intuniform(1, 8, step=0), "step must be a positive integer"),
        (lambda: choice([]), "at least one value"),
        (lambda: choice("sgd"), "takes a list"),
    ],
)
def test_bad_distributions_say_what_is_wrong(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_distributions_become_optuna_distributions():
    od = optuna.distributions
    assert to_optuna(loguniform(1e-3, 0.1)) == od.FloatDistribution(1e-3, 0.1, log=True)
    assert to_optuna(uniform(0.5, 0.9)) == od.FloatDistribution(0.5, 0.9)
    assert to_optuna(intuniform(1, 9, step=2)) == od.IntDistribution(1, 9, step=2)
    assert to_optuna(choice([16, 32])) == od.CategoricalDistribution([16, 32])
    mine = od.FloatDistribution(0.0, 1.0)
    assert to_optuna(mine) is mine and is_distribution(mine) and not is_distribution(0.9)


def test_choices_of_any_values_are_stored_by_unique_labels():
    c = choice([dfdl.optim.SGD, "adam", 1.0, dfdl.optim.SGD])
    assert c.labels() == ["SGD", "adam", 1.0, "SGD#3"]
    assert to_optuna(c).choices == ("SGD", "adam", 1.0, "SGD#3")
