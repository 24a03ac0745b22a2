"""The actor type's older path: landed migrations name ``approvals.actors.ActorField``.

Code imports ``common.actors``; migrations that have landed are never edited (STYLE.md).
"""

from common.actors import Actor as Actor
from common.actors import ActorField as ActorField
