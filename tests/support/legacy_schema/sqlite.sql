-- The tables as groupbuy made them with create_all on sqlite before it had migrations
-- (the DDL SQLAlchemy emitted for the models of commit 72e4337), kept to test adopting
-- such a database. Statements end with ';' at the end of a line.

CREATE TABLE accounts (
	user_id VARCHAR(64) NOT NULL,
	balance_cents BIGINT NOT NULL,
	PRIMARY KEY (user_id)
);

CREATE TABLE acknowledged_grabs (
	packet_id VARCHAR(64) NOT NULL,
	user_id VARCHAR(64) NOT NULL,
	epoch INTEGER NOT NULL,
	seq INTEGER NOT NULL,
	amount_cents BIGINT NOT NULL,
	acked_at DATETIME NOT NULL,
	source VARCHAR(16) NOT NULL,
	PRIMARY KEY (packet_id, user_id, epoch)
);

CREATE TABLE activities (
	activity_id VARCHAR(64) NOT NULL,
	name VARCHAR(200),
	team_size INTEGER NOT NULL,
	lock_ttl_s INTEGER NOT NULL,
	team_deadline_s INTEGER NOT NULL,
	created_at DATETIME NOT NULL,
	PRIMARY KEY (activity_id)
);

CREATE TABLE blocked_users (
	user_id VARCHAR(64) NOT NULL,
	reason VARCHAR(500),
	blocked_at DATETIME NOT NULL,
	PRIMARY KEY (user_id)
);

CREATE TABLE dead_letters (
	id INTEGER NOT NULL,
	stream VARCHAR(16) NOT NULL,
	owner_id VARCHAR(64) NOT NULL,
	entry_id VARCHAR(64) NOT NULL,
	record_type VARCHAR(64),
	user_id VARCHAR(300),
	fields TEXT NOT NULL,
	error TEXT NOT NULL,
	dead_at DATETIME NOT NULL,
	replayed_at DATETIME,
	PRIMARY KEY (id),
	UNIQUE (stream, owner_id, entry_id)
);

CREATE INDEX ix_dead_letters_user_id ON dead_letters (user_id);

CREATE TABLE events (
	id INTEGER NOT NULL,
	type VARCHAR(64) NOT NULL,
	at DATETIME NOT NULL,
	dedup_key VARCHAR(300) NOT NULL,
	data TEXT NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (dedup_key)
);

CREATE TABLE grabs (
	packet_id VARCHAR(64) NOT NULL,
	user_id VARCHAR(64) NOT NULL,
	seq INTEGER NOT NULL,
	amount_cents BIGINT NOT NULL,
	grabbed_at DATETIME NOT NULL,
	PRIMARY KEY (packet_id, user_id),
	UNIQUE (packet_id, seq)
);

CREATE INDEX ix_grabs_grabbed_at ON grabs (grabbed_at);

CREATE TABLE ledger_entries (
	id INTEGER NOT NULL,
	business_key VARCHAR(200) NOT NULL,
	user_id VARCHAR(64) NOT NULL,
	kind VARCHAR(32) NOT NULL,
	amount_cents BIGINT NOT NULL,
	created_at DATETIME NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (business_key)
);

CREATE INDEX ix_ledger_entries_user_id ON ledger_entries (user_id);

CREATE TABLE packet_epochs (
	packet_id VARCHAR(64) NOT NULL,
	epoch INTEGER NOT NULL,
	rebuilt_at DATETIME NOT NULL,
	grabs_kept INTEGER NOT NULL,
	PRIMARY KEY (packet_id)
);

CREATE TABLE packets (
	packet_id VARCHAR(64) NOT NULL,
	sender_id VARCHAR(64) NOT NULL,
	amount_cents BIGINT NOT NULL,
	count INTEGER NOT NULL,
	strategy VARCHAR(32) NOT NULL,
	expires_in_s INTEGER NOT NULL,
	status VARCHAR(16) NOT NULL,
	created_at DATETIME NOT NULL,
	expires_at DATETIME NOT NULL,
	sold_out_at DATETIME,
	expired_at DATETIME,
	refunded_cents BIGINT NOT NULL,
	records_done BOOLEAN NOT NULL,
	redis_cleared BOOLEAN NOT NULL,
	PRIMARY KEY (packet_id)
);

CREATE INDEX ix_packets_records_done ON packets (records_done);

CREATE INDEX ix_packets_redis_cleared ON packets (redis_cleared);

CREATE INDEX ix_packets_status ON packets (status);

CREATE TABLE reconcile_reports (
	id INTEGER NOT NULL,
	started_at DATETIME NOT NULL,
	finished_at DATETIME NOT NULL,
	ledger_watermark BIGINT NOT NULL,
	event_watermark BIGINT NOT NULL,
	report TEXT NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_reconcile_reports_started_at ON reconcile_reports (started_at);

CREATE TABLE team_members (
	activity_id VARCHAR(64) NOT NULL,
	team_id VARCHAR(64) NOT NULL,
	user_id VARCHAR(64) NOT NULL,
	order_id VARCHAR(64),
	seq INTEGER NOT NULL,
	joined_at DATETIME NOT NULL,
	PRIMARY KEY (activity_id, team_id, user_id),
	UNIQUE (activity_id, team_id, seq)
);

CREATE TABLE activity_rules (
	activity_id VARCHAR(64) NOT NULL,
	virtual_min_members INTEGER,
	teams_per_user INTEGER,
	open_teams_per_leader INTEGER,
	PRIMARY KEY (activity_id),
	FOREIGN KEY(activity_id) REFERENCES activities (activity_id)
);

CREATE TABLE teams (
	activity_id VARCHAR(64) NOT NULL,
	team_id VARCHAR(64) NOT NULL,
	leader_id VARCHAR(64) NOT NULL,
	status VARCHAR(16) NOT NULL,
	size INTEGER NOT NULL,
	created_at DATETIME NOT NULL,
	deadline_at DATETIME NOT NULL,
	formed_at DATETIME,
	failed_at DATETIME,
	redis_cleared BOOLEAN NOT NULL,
	PRIMARY KEY (activity_id, team_id),
	FOREIGN KEY(activity_id) REFERENCES activities (activity_id)
);

CREATE INDEX ix_teams_redis_cleared ON teams (redis_cleared);
