"""Tests of the operator's commands: launch, reconcile, rerun, status and the demo."""
