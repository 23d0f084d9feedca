"""RedPackets: the red-packet engine's parts, each with one job, built together once.

Callers reach the part they need (`packets.grabs.grab`, `packets.accounts.deposit`,
`packets.sweeps.expire_due`); the parts share one set of script wrappers, and the grab
path reaches recovery only through the hook it is handed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from groupbuy.redpacket.accounts import AccountService
from groupbuy.redpacket.acks import AckJournal
from groupbuy.redpacket.admission import PACKET_ADMIT, PACKET_UNADMIT
from groupbuy.redpacket.grab import PACKET_GRAB, GrabService, PasswordSalts, nothing_recorded
from groupbuy.redpacket.listing import ListingService
from groupbuy.redpacket.read import PACKET_GRAB_READ, PACKET_READ, ReadService
from groupbuy.redpacket.recovery import PACKET_RESTORE, RecoveryService
from groupbuy.redpacket.send import PACKET_CREATE, SendService
from groupbuy.redpacket.specs import PacketScripts
from groupbuy.redpacket.sweeps import PACKET_EXPIRE, SweepService
from groupbuy.redpacket.withdraw import PACKET_WITHDRAW, WithdrawService
from groupbuy.redpacket.writer import PacketRecordWriter
from groupbuy.settings import RedPacketSettings
from groupbuy.storage.backends import Backends
from groupbuy.storage.specs import ScriptSpec

# Every script of the engine by its spec, each in its operation's module (docs/scripts.md
# is rendered from them).
CONTRACTS: tuple[ScriptSpec[Any], ...] = (
    PACKET_CREATE,
    PACKET_RESTORE,
    PACKET_GRAB,
    PACKET_READ,
    PACKET_GRAB_READ,
    PACKET_WITHDRAW,
    PACKET_EXPIRE,
    PACKET_ADMIT,
    PACKET_UNADMIT,
)


@dataclass(frozen=True)
class RedPackets:
    """Red packets and the accounts they move money between, one part per job."""

    accounts: AccountService  # deposits and balances
    sending: SendService  # send, and the repair of half-done sends
    grabs: GrabService  # the hot path
    reads: ReadService  # a packet with its grabs
    withdrawals: WithdrawService  # the sender takes the rest back
    listing: ListingService  # pages of packets and of ledger entries
    recovery: RecoveryService  # packets Redis lost, rebuilt from SQL
    sweeps: SweepService  # expiry, re-index, release
    writer: PacketRecordWriter  # Redis's records -> SQL
    acks: AckJournal  # the journal of grabs answered `grabbed`

    @classmethod
    def build(
        cls,
        backends: Backends,
        limits: RedPacketSettings,
        writer: PacketRecordWriter,
        acks: AckJournal,
        resend_window_ms: int = 60_000,
        recorded: Callable[[], None] = nothing_recorded,
    ) -> RedPackets:
        """Wire the parts over one set of backends (the composition root calls this);
        `recorded` is called after each grab that wrote a record (it wakes the write-behind)."""
        scripts = PacketScripts(backends.scripts, backends.keys, backends.clock)
        sending = SendService(backends, scripts, limits)
        recovery = RecoveryService(backends, scripts, limits, sending)
        reads = ReadService(backends, scripts, recovery)
        salts = PasswordSalts(backends.redis, backends.keys)
        return cls(
            accounts=AccountService(backends),
            sending=sending,
            grabs=GrabService(scripts, acks, recovery, salts, resend_window_ms, recorded),
            reads=reads,
            withdrawals=WithdrawService(backends, scripts, recovery, writer, reads),
            listing=ListingService(backends),
            recovery=recovery,
            sweeps=SweepService(backends, scripts, writer, recovery),
            writer=writer,
            acks=acks,
        )
