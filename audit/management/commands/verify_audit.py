from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.checkpoint_file import CheckpointFileError
from audit.checkpoints import audit_checkpoint
from audit.verification import (
    audit_checkpoint_newest,
    audit_verification_incremental,
    audit_verification_run,
    audit_verify_job_step,
)
from audit.verify_walk import VerifyTally


class Command(BaseCommand):
    help = (
        "Check every audit chain against its hashes and the signed checkpoints; name the "
        "first problem and exit non-zero. When all is intact, sign a new checkpoint. "
        "--routine and --full-slice do what beat's tasks do instead: the verification of "
        "what is new since the last verified checkpoint, or one slice of the full job."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-checkpoint", action="store_true", help="verify only; sign nothing new"
        )
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument(
            "--routine",
            action="store_true",
            help="verify only what the checkpoints signed since the last verified one",
        )
        mode.add_argument(
            "--full-slice",
            action="store_true",
            help="run one slice of the full verification job (starting one if none runs)",
        )

    def handle(
        self,
        *args: Any,
        no_checkpoint: bool = False,
        routine: bool = False,
        full_slice: bool = False,
        **options: Any,
    ) -> None:
        if routine:
            self._routine()
            return
        if full_slice:
            self._full_slice()
            return
        tally = VerifyTally()
        verification = audit_verification_run(tally=tally)
        if not verification.ok:
            raise CommandError(f"audit log broken: {verification.problem}")
        if not no_checkpoint:
            try:
                audit_checkpoint()
            except CheckpointFileError as exc:
                raise CommandError(
                    f"audit log intact, but the new checkpoint is not in the checkpoint file: {exc}"
                ) from None
        # What the verification counted: counting the log again would read it twice.
        self.stdout.write(f"audit log intact: {tally.events} events in {tally.chains} chains")
        checkpoint = audit_checkpoint_newest()
        if checkpoint is None:
            self.stdout.write("no checkpoint yet: nothing is signed")
        else:
            self.stdout.write(
                f"newest checkpoint #{checkpoint.number} signed at "
                f"{checkpoint.made_at:%Y-%m-%d %H:%M:%S} UTC, covering events up to "
                f"id {checkpoint.watermark}"
            )

    def _routine(self) -> None:
        verification = audit_verification_incremental(
            max_events=settings.SETTLE_AUDIT_VERIFY_MAX_EVENTS
        )
        if verification is None:
            self.stdout.write("no checkpoint yet: nothing is signed")
            return
        if not verification.ok:
            raise CommandError(f"audit log broken: {verification.problem}")
        self.stdout.write(
            f"intact through checkpoint #{verification.checkpoint}: "
            f"{verification.events_checked} new events checked"
        )

    def _full_slice(self) -> None:
        job = audit_verify_job_step(
            slice_events=settings.SETTLE_AUDIT_VERIFY_SLICE_EVENTS, restart_after_seconds=0.0
        )
        if job is None:
            self.stdout.write("no full verification to run")
            return
        outcome = job.verification
        if outcome is not None and not outcome.ok:
            raise CommandError(f"audit log broken: {outcome.problem}")
        state = "finished" if outcome is not None else f"at {job.phase}"
        self.stdout.write(
            f"full verification {state}: {job.events_checked} events in {job.chains_checked} "
            f"chains, {job.slices} slices"
        )
