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

# Why these recipes (benchmarks/probe_recipes.py; every run in benchmarks/results/probe_recipes.json): the quick form
# trains reverse at L = 5 with every size in every batch (mixed_sizes) and sizes from 3 (min_size), which brought the
# learned table (0.998) and RoPE (0.969) to 0.9 at L where L = 6 or 8 did not; a third layer at lr 5e-3 brings every
# ranking scheme there on the 3-seed mean (NoPE 0.947, ALiBi 0.921, T5 0.994, sinusoidal 0.999, learned 1.000; at 2
# layers NoPE failed some seeds at up to 2000 steps), about 33 s of one core a training. MQAR needs a size curriculum:
# without one no recipe measured (up to 8000 steps) formed its induction circuit (0.27-0.32 at L, chance 0.0625);
# 2 -> 4 pairs over the first 1000 of 1600 steps at lr 1.5e-3 gives 4 heads 1.0 at L, seeds 0-2, and 0.904-1.0 on
# held-out seeds 3-5 (lr 2e-3 lost a late seed: 0.262). The full form keeps 4 pairs (at 8 pairs not even 2 were
# learned in 3000 steps at any lr from 5e-4 to 1e-2):
# 8 heads 0.966, 4 heads 0.938, 2 heads 0.622, 1 head 0.383 on the 5-seed mean, 25-36 s of one core each.
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
