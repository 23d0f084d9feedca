"""Group-buy seat locking: activities, teams, seat locks and membership."""
