"""Child episodes (seed 002): the model is free inside a child pass, the parent decides between them.

    episode = Episode(name="fix", instructions="...", output=Patch,
                      budgets=EpisodeBudgets(turns_per_pass=6, passes=3, rejected_responses=2))
    result = await episode.run("fix the failing test", session=Session("dev-1", gateway, store),
                               snapshot=repo_copy, decide=check_on_a_copy, apply=apply_patch,
                               lookup=find_applied_patch)
    print(result.status, len(result.passes), result.turns, result.rejected, result.cost_usd)

See :mod:`cuaderno.episodes.episode` for what is journaled and how a resume re-attaches. Child
passes run through a :class:`ChildRunner`: in this process by default, as child workflows under
Temporal (:func:`cuaderno.temporal.build_episode_worker`).
"""

from cuaderno.episodes.budgets import EpisodeBudgets
from cuaderno.episodes.episode import (
    EPISODE_VERSION,
    ChildOutcome,
    ChildPass,
    ChildRunner,
    Decision,
    Episode,
    EpisodeResult,
    LocalChildRunner,
    PassRecord,
)

__all__ = ["EPISODE_VERSION", "ChildOutcome", "ChildPass", "ChildRunner", "Decision", "Episode", "EpisodeBudgets",
           "EpisodeResult", "LocalChildRunner", "PassRecord"]
