"""The probes experiment's forms (``smoke``, ``quick``, ``full``): tasks, lengths, seeds and recipes, and the quick
lab's plan of them (:func:`planned_form`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from poslab.analysis.probes import TASKS, ProbeRecipe
from poslab.lab.experiments.common import OLDER
from poslab.lab.scale import ScaleTable

#: the experiment's name in :data:`poslab.lab.plan.QUICK_SEEDS`
NAME = "probes"


@dataclass(frozen=True, kw_only=True)
class Form:
    """One form of the experiment (``quick``, ``full``, ``smoke`` for tests).

    Attributes:
        name: label.
        tasks: probe tasks trained for every scheme.
        ranking_tasks: the tasks whose past-L accuracy decides the ranking claims.
        train_size: ``L``.
        factors: test sizes as multiples of ``L``.
        seeds: training seeds (at least 3 for conclusive verdicts).
        recipe: model and schedule.
        heads: MQAR head counts at fixed width (``()``: no head-count comparison).
        heads_recipe: the recipe of the head-count runs (its ``n_head`` is replaced).
        heads_size: ``L`` of the head-count runs (key-value pairs; ``None``: ``train_size``).
        schemes: the position schemes trained (``None``: every registered one).
        left_out: the arms of the form the plan does not train at this form (:func:`planned_form`): their claims
            are not testable at this scale (:func:`poslab.lab.experiments.declaration.not_trained`).
    """

    name: str
    tasks: tuple[str, ...]
    ranking_tasks: tuple[str, ...]
    train_size: int
    factors: tuple[int, ...]
    seeds: tuple[int, ...]
    recipe: ProbeRecipe
    heads: tuple[int, ...] = ()
    heads_recipe: ProbeRecipe = field(default_factory=ProbeRecipe)
    heads_size: int | None = None
    schemes: tuple[str, ...] | None = None
    left_out: tuple[str, ...] = field(default=(), metadata=OLDER)

    @property
    def mqar_size(self) -> int:
        return self.train_size if self.heads_size is None else self.heads_size


#: the arm of the MQAR head-count runs in :data:`poslab.lab.plan.QUICK_SEEDS`
HEADS_ARM = "heads"
#: the schemes the quick form trains: the Kazemnejad et al. ranking and the learned table
QUICK_SCHEMES = ("none", "learned", "sinusoidal", "rope", "alibi", "t5")

# The quick form trains reverse (the ranking task, a Kazemnejad et al. task) at L = 5 for the ranking's
# schemes and the learned table, 3 seeds. Why this recipe (benchmarks/probe_recipes.py, every run in
# benchmarks/results/probe_recipes.json): at L = 8 or 6 with one size per batch no recipe of about
# 400 steps brought RoPE and the learned table both to 0.9 at L; every size in every batch
# (mixed_sizes) lifted the learned table (0.61 -> 0.81 at L = 6), L = 5 lifted it to 0.998, and
# training sizes 3..5 (min_size 3) lifted RoPE (0.889 -> 0.969 at 400 steps). At 2 layers and 400 steps
# ALiBi (0.53) and NoPE (0.43) did not learn reverse; at 2 layers and 1000 steps ALiBi did (0.944) but
# NoPE learned it on some seeds only (0.848, 0.777, 0.495), and neither 1500 nor 2000 steps at 2 layers
# nor 1500 at 3 layers and lr 1e-2 rescued its failing seed. A third layer at lr 5e-3 did: every
# scheme of the ranking reaches 0.9 at L on the 3-seed mean (NoPE 0.947, ALiBi 0.921, T5 0.994,
# sinusoidal 0.999, learned 1.000), about 33 s of one core per training.
# The head-count runs train MQAR with 4 pairs under a size curriculum: without one, no recipe measured
# (up to 8000 steps) formed the induction circuit MQAR needs (0.27-0.32 at L, chance 0.0625), while
# 2 pairs are learned in about 300 steps; growing the largest size from 2 to 4 pairs over the first
# 1000 of 1600 steps at lr 1.5e-3 carries the circuit to 4 pairs: 4 heads 1.0 at L on seeds 0-2 (and
# 0.904-1.0 on seeds 3-5), about 17 s of one core per training. lr 2e-3 lost a late seed (0.262).
# The full form's head-count runs (1, 2, 4, 8 heads, seeds 0-4) keep 4 pairs too: the task has 4 L keys,
# and at 8 pairs (32 keys) not even the curriculum's first stage, 2 pairs, was learned in 3000 steps at
# any lr from 5e-4 to 1e-2; at 4 pairs, 3000 steps at lr 1e-3 with 1200 steps of 2 pairs gave 8 heads
# 0.966 and 4 heads 0.938 on the 5-seed mean (2 heads 0.622, 1 head 0.383), 25-36 s of one core each.
#: the smoke form's recipe, for its probes and its head-count runs alike
_SMOKE = ProbeRecipe(n_layer=1, n_head=2, n_embd=16, steps=6, batch_size=8, lr=1e-2, warmup_steps=2, eval_batch=8)
#: the quick form's head-count recipe (MQAR, 4 pairs, a size curriculum; the full form's runs it longer); the
#: recipes give what differs from :class:`~poslab.analysis.probes.ProbeRecipe`'s defaults (2 layers, 4 heads, 64 wide)
_QUICK_HEADS = ProbeRecipe(steps=1600, batch_size=64, lr=1.5e-3, warmup_steps=100, curriculum_steps=1000)
FORMS: ScaleTable[Form] = ScaleTable(
    Form(
        name="smoke",
        tasks=("reverse", "retrieve"),
        ranking_tasks=("reverse",),
        train_size=4,
        factors=(1, 2),
        seeds=(0, 1, 2),
        recipe=_SMOKE,
        heads=(1, 2),
        heads_recipe=_SMOKE,
    ),
    Form(
        name="quick",
        tasks=("reverse",),
        ranking_tasks=("reverse",),
        train_size=5,
        factors=(1, 2, 4),
        seeds=(0, 1, 2),
        recipe=ProbeRecipe(
            n_layer=3, steps=1000, batch_size=128, lr=5e-3, warmup_steps=100, min_size=3, mixed_sizes=True
        ),
        heads=(1, 4),
        heads_recipe=_QUICK_HEADS,
        heads_size=4,
        schemes=QUICK_SCHEMES,
    ),
    Form(
        name="full",
        tasks=TASKS,
        ranking_tasks=("copy", "reverse"),
        train_size=16,
        factors=(1, 2, 4),
        seeds=(0, 1, 2, 3, 4),
        recipe=ProbeRecipe(steps=1500, batch_size=64, warmup_steps=100, eval_batch=256),
        heads=(1, 2, 4, 8),
        heads_recipe=dataclasses.replace(_QUICK_HEADS, steps=3000, lr=1e-3, eval_batch=256, curriculum_steps=2400),
        heads_size=4,
    ),
    what="probes form",
)


def planned_form(form: Form) -> Form:
    """``form`` with the quick lab's arms and seeds (:data:`poslab.lab.plan.QUICK_SEEDS`): the schemes at their
    planned seeds (the same for every trained scheme: the claims pair them by seed), the head-count runs only
    where the plan trains them; the arms at 0 are left to the full form (``left_out``)."""
    from poslab.lab.experiments.training import planned_seeds

    arms = planned_seeds(NAME, (*(form.schemes or ()), HEADS_ARM), quick=True)
    schemes = tuple(s for s in form.schemes or () if s in arms)
    counts = {len(arms[s]) for s in schemes}
    if len(counts) > 1:
        raise ValueError(f"probes: the plan gives the schemes different seed counts {counts}: they must be paired")
    seeds = tuple(range(len(arms[schemes[0]]))) if schemes else form.seeds  # the form's seeds 0, 1, ...
    left_out = tuple(s for s in (*(form.schemes or ()), HEADS_ARM) if s not in arms)
    heads = form.heads if HEADS_ARM in arms else ()
    return dataclasses.replace(form, schemes=schemes, seeds=seeds, heads=heads, left_out=left_out)


def form_of(quick: bool, form: str | None = None) -> Form:
    """The :class:`Form` named ``form``, else ``quick`` or ``full``."""
    return FORMS.pick(form or ("quick" if quick else "full"))
