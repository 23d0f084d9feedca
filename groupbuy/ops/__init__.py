"""What time and operators do: the scheduled jobs, their scheduler, reconciliation."""
