"""The approval side: reversal plans, sign-off, execution and policies arrive with later issues."""
