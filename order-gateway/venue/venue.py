#!/usr/bin/env python3
"""A FIX 4.4 venue for order-gateway tests: a real QuickFIX acceptor with a tiny matcher.

Deterministic rules, by symbol and quantity of a NewOrderSingle:
  symbol "REJ"           -> ExecutionReport Rejected (150=8)
  qty <= 100             -> New, then one Fill
  100 < qty <= 1000      -> New, PartialFill of qty//2, then Fill of the rest
  qty > 1000             -> New, then rests (cancel -> Canceled, replace -> Replaced)
Cancel/replace of an order that is not resting -> OrderCancelReject (35=9).
OrderStatusRequest (35=H) -> ExecutionReport 150=I with the order's status (an order this run
never saw: 39=8, 103=5), logged as "H|ClOrdID|status".

An order the venue logged but died before answering is handled when QuickFIX asks for it
again (PossDup); one already answered is never executed twice. The QuickFIX FileStore (sequence numbers, sent messages) and FileLog live under --dir, so the
venue can be killed and restarted. Every application message accepted is appended to
<dir>/received.log as "msgtype|ClOrdID|PossDup|MsgSeqNum"; ClOrdIDs already seen (also across
restarts) are recorded as "dup" and not executed again. Prints "READY <port>" when listening.

Commands on stdin, one a line, make the venue do what a test needs (QuickFIX does the session
work: numbering, persisting, answering):
  reset          send Logon with ResetSeqNumFlag=Y (both sides start again at 1)
  seqreset N     send SequenceReset-Reset jumping our MsgSeqNum N ahead
  fill CL Q PX   execute Q of resting order CL at PX (a Fill, 150=F), sent whether the
                 gateway is logged on or not (QuickFIX stores it for a resend; a reset at
                 the next logon loses it, and only the status answer tells); logged as
                 "fill|CL|Q|PX" once sent

--reset-on-logon sets QuickFIX's ResetOnLogon=Y (both sides start at 1 at every logon);
--username/--password make the venue refuse a Logon without that Username (553) and
Password (554) as QuickFIX's RejectLogon would: a Logout with Text "bad Username or
Password" instead of the Logon answer, then the connection is closed; the venue keeps
running and accepts a later Logon that has them (each refusal is logged to received.log as
"refused|MsgSeqNum").
(Nothing is printed: the test harness stops reading stdout after READY.)
"""
import argparse
import os
import sys
import threading
import time

try:
    import quickfix as fix
except ImportError:
    sys.stderr.write("venue.py: python package 'quickfix' missing: pip install -r order-gateway/venue/requirements.txt\n")
    sys.exit(3)


def find_dictionary():
    for base in (sys.prefix, getattr(sys, "base_prefix", sys.prefix), "/usr/local", "/usr"):
        p = os.path.join(base, "share", "quickfix", "FIX44.xml")
        if os.path.exists(p):
            return p
    sys.stderr.write("venue.py: FIX44.xml not found (shipped by quickfix-ssl under <prefix>/share/quickfix)\n")
    sys.exit(3)


class Venue(fix.Application):
    def __init__(self, directory, username=None, password=None):
        super().__init__()
        self.username = username
        self.password = password
        self.lock = threading.Lock()
        self.log_path = os.path.join(directory, "received.log")
        self.seen = set()
        self.done = set()
        self.resting = {}  # ClOrdID -> dict(symbol, side, qty, cum, price, order_id)
        self.orders = {}  # every order of this run by ClOrdID, for OrderStatusRequests
        self.next_exec = int(time.time() * 1000) * 1000
        self.sid = None
        # Session (as a string) -> Text of the Logout refusing the Logon being handled.
        self.refusing = {}
        if os.path.exists(self.log_path):
            with open(self.log_path) as f:
                for line in f:
                    parts = line.strip().split("|")
                    if len(parts) >= 2 and parts[0] == "ok":
                        self.done.add(parts[1])
                    elif len(parts) >= 2 and parts[0] not in ("dup", "redo", "H", "refused"):
                        self.seen.add(parts[1])
        self.log = open(self.log_path, "a", buffering=1)

    def onCreate(self, sid): pass

    def onLogon(self, sid):
        if self.refusing.pop(sid.toString(), None) is not None:
            # QuickFIX went on with the refused Logon (its answer and any ResendRequest
            # were stored, not sent: the connection was already closed): reset the
            # session's logon state, so the next connection is judged afresh.
            fix.Session.lookupSession(sid).disconnect()
            return
        self.sid = sid

    def onLogout(self, sid): pass

    def toAdmin(self, msg, sid):
        # The Logon fromAdmin sends for a refusal goes out as a Logout with the reason: a
        # Logon is the only admin message QuickFIX transmits before the session is logged on.
        key = sid.toString()
        reason = self.refusing.get(key)
        if not reason or msg.getHeader().getField(35) != "A":
            return
        self.refusing[key] = ""  # sent: QuickFIX's own answer that follows stays a Logon
        msg.getHeader().setField(fix.MsgType(fix.MsgType_Logout))
        for tag in (98, 108, 141, 789):
            if msg.isSetField(tag):
                msg.removeField(tag)
        msg.setField(fix.Text(reason))

    def fromAdmin(self, msg, sid):
        if msg.getHeader().getField(35) != "A" or self.username is None:
            return
        user = msg.getField(553) if msg.isSetField(553) else None
        password = msg.getField(554) if msg.isSetField(554) else None
        if user == self.username and password == self.password:
            return
        # QuickFIX's way is `raise fix.RejectLogon(text)`, but in the quickfix-ssl wheel that
        # C++ exception cannot leave Session::verify: std::terminate kills the venue. So
        # refuse by hand, as RejectLogon does: a Logout with the reason (sent as a Logon
        # that toAdmin rewrites), then close the connection. QuickFIX then finishes the
        # Logon with nobody to send to; onLogon clears the state it leaves.
        reason = "bad Username or Password"
        self.log.write("refused|%s\n" % msg.getHeader().getField(34))
        self.refusing[sid.toString()] = reason
        logout = fix.Message()
        logout.getHeader().setField(fix.MsgType(fix.MsgType_Logon))
        fix.Session.sendToTarget(logout, sid)
        fix.Session.lookupSession(sid).disconnect()

    def toApp(self, msg, sid): pass

    def fromApp(self, msg, sid):
        with self.lock:
            self.handle(msg, sid)

    def exec_id(self):
        self.next_exec += 1
        return str(self.next_exec)

    def report(self, sid, o, cl, exec_type, status, last_qty=0, last_px="0", orig=None,
               rej_reason=None):
        r = fix.Message()
        r.getHeader().setField(fix.MsgType(fix.MsgType_ExecutionReport))
        r.setField(fix.OrderID(o["order_id"]))
        r.setField(fix.ExecID(self.exec_id()))
        r.setField(fix.ClOrdID(cl))
        if orig:
            r.setField(fix.OrigClOrdID(orig))
        r.setField(fix.ExecType(exec_type))
        r.setField(fix.OrdStatus(status))
        r.setField(fix.Symbol(o["symbol"]))
        r.setField(fix.Side(o["side"]))
        r.setField(fix.OrderQty(o["qty"]))
        r.setField(fix.LastQty(last_qty))
        r.setField(fix.LastPx(float(last_px)))
        r.setField(fix.LeavesQty(max(o["qty"] - o["cum"], 0) if status not in ("4", "8", "2") else 0))
        r.setField(fix.CumQty(o["cum"]))
        r.setField(fix.AvgPx(avg_px(o)))
        if rej_reason is not None:
            r.setField(fix.OrdRejReason(rej_reason))
        fix.Session.sendToTarget(r, sid)

    def cancel_reject(self, sid, cl, orig, response_to):
        r = fix.Message()
        r.getHeader().setField(fix.MsgType(fix.MsgType_OrderCancelReject))
        r.setField(fix.OrderID("NONE"))
        r.setField(fix.ClOrdID(cl))
        r.setField(fix.OrigClOrdID(orig))
        r.setField(fix.OrdStatus("8"))
        r.setField(fix.CxlRejResponseTo(response_to))
        fix.Session.sendToTarget(r, sid)

    def order_status(self, msg, sid):
        """OrderStatusRequest: an ExecutionReport with ExecType I for an order we know (live
        or done), or OrdStatus Rejected with OrdRejReason 5 (unknown order)."""
        cl = msg.getField(11)
        o = self.orders.get(cl)
        self.log.write("H|%s|status\n" % cl)
        if o is None:
            o = dict(symbol=msg.getField(55), side=msg.getField(54), qty=0, cum=0,
                     price="0", order_id="NONE")
            self.report(sid, o, cl, "I", "8", rej_reason=5)
            return
        status = "2" if o["cum"] >= o["qty"] else ("1" if o["cum"] else "0")
        if cl not in self.resting and o["cum"] < o["qty"]:
            status = "4" if o["symbol"] != "REJ" else "8"
        self.report(sid, o, cl, "I", status)

    def handle(self, msg, sid):
        mt = msg.getHeader().getField(35)
        cl = msg.getField(11)
        if mt == "H":
            self.order_status(msg, sid)
            return
        possdup = msg.getHeader().isSetField(43) and msg.getHeader().getField(43) == "Y"
        seq = msg.getHeader().getField(34)
        if cl in self.seen and (cl in self.done or not possdup):
            self.log.write("dup|%s|%s|%s|%s\n" % (cl, mt, "Y" if possdup else "N", seq))
            return
        if cl in self.seen:
            # We died while handling it (QuickFIX had not committed its sequence number, so it
            # asked for the resend): the order was never answered, so handle it now.
            self.log.write("redo|%s|%s|%s|%s\n" % (cl, mt, "Y" if possdup else "N", seq))
        else:
            self.seen.add(cl)
            self.log.write("%s|%s|%s|%s\n" % (mt, cl, "Y" if possdup else "N", seq))
        self.execute(mt, cl, msg, sid)
        self.done.add(cl)
        self.log.write("ok|%s\n" % cl)

    def execute(self, mt, cl, msg, sid):
        if mt == "D":
            qty = int(float(msg.getField(38)))
            o = dict(symbol=msg.getField(55), side=msg.getField(54), qty=qty, cum=0,
                     price=msg.getField(44), order_id="V" + cl)
            self.orders[cl] = o
            if o["symbol"] == "REJ":
                self.report(sid, o, cl, "8", "8")
                return
            self.report(sid, o, cl, "0", "0")
            if qty <= 100:
                o["cum"] = qty
                o["notional"] = qty * float(o["price"])
                self.report(sid, o, cl, "F", "2", qty, o["price"])
            elif qty <= 1000:
                half = qty // 2
                o["cum"] = half
                o["notional"] = half * float(o["price"])
                self.report(sid, o, cl, "F", "1", half, o["price"])
                o["cum"] = qty
                o["notional"] = qty * float(o["price"])
                self.report(sid, o, cl, "F", "2", qty - half, o["price"])
            else:
                self.resting[cl] = o
        elif mt == "F":
            orig = msg.getField(41)
            o = self.resting.pop(orig, None)
            if o is None:
                self.cancel_reject(sid, cl, orig, "1")
                return
            self.report(sid, o, cl, "4", "4", orig=orig)
        elif mt == "G":
            orig = msg.getField(41)
            o = self.resting.pop(orig, None)
            if o is None:
                self.cancel_reject(sid, cl, orig, "2")
                return
            o["qty"] = int(float(msg.getField(38)))
            o["price"] = msg.getField(44)
            self.resting[cl] = o
            self.orders[cl] = o
            self.report(sid, o, cl, "5", "0", orig=orig)


def avg_px(o):
    """AvgPx (6): executed notional over CumQty, 0 before any execution."""
    if not o["cum"]:
        return 0.0
    return round(o.get("notional", o["cum"] * float(o["price"])) / o["cum"], 6)


def fill(app, cl, qty, px):
    """Executes `qty` of resting order `cl` at `px` (command `fill`; the caller holds
    app.lock)."""
    o = app.resting.get(cl)
    if o is None:
        app.log.write("nofill|%s\n" % cl)
        return
    qty = min(qty, o["qty"] - o["cum"])
    o["cum"] += qty
    o["notional"] = o.get("notional", 0.0) + qty * float(px)
    done = o["cum"] >= o["qty"]
    if done:
        del app.resting[cl]
    app.report(app.sid, o, cl, "F", "2" if done else "1", qty, px)
    app.log.write("fill|%s|%d|%s\n" % (cl, qty, px))


def command(app, line):
    parts = line.split()
    if not parts or app.sid is None:
        return
    if parts[0] == "fill":
        fill(app, parts[1], int(parts[2]), parts[3])
    elif parts[0] == "reset":
        m = fix.Message()
        m.getHeader().setField(fix.MsgType(fix.MsgType_Logon))
        m.setField(fix.EncryptMethod(0))
        m.setField(fix.HeartBtInt(5))
        m.setField(fix.ResetSeqNumFlag(True))
        fix.Session.sendToTarget(m, app.sid)
    elif parts[0] == "seqreset":
        s = fix.Session.lookupSession(app.sid)
        new = s.getExpectedSenderNum() + int(parts[1])
        m = fix.Message()
        m.getHeader().setField(fix.MsgType(fix.MsgType_SequenceReset))
        m.setField(fix.NewSeqNo(new))
        fix.Session.sendToTarget(m, app.sid)
        s.setNextSenderMsgSeqNum(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dir", required=True, help="state directory (store, logs, received.log)")
    ap.add_argument("--sender", default="VENUE")
    ap.add_argument("--target", default="GW")
    ap.add_argument("--reset-on-logon", action="store_true")
    ap.add_argument("--username")
    ap.add_argument("--password")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    cfg = os.path.join(a.dir, "venue.cfg")
    with open(cfg, "w") as f:
        f.write("""[DEFAULT]
ConnectionType=acceptor
FileStorePath={d}/store
FileLogPath={d}/log
NonStopSession=Y
StartTime=00:00:00
EndTime=00:00:00
UseDataDictionary=Y
DataDictionary={dd}
SocketAcceptPort={port}
SocketAcceptHost=127.0.0.1
ResetOnLogon={reset}
ResetOnLogout=N
ResetOnDisconnect=N
PersistMessages=Y
[SESSION]
BeginString=FIX.4.4
SenderCompID={s}
TargetCompID={t}
""".format(d=a.dir, dd=find_dictionary(), port=a.port, s=a.sender, t=a.target,
           reset="Y" if a.reset_on_logon else "N"))
    app = Venue(a.dir, a.username, a.password)
    settings = fix.SessionSettings(cfg)
    acceptor = fix.SocketAcceptor(app, fix.FileStoreFactory(settings), settings, fix.FileLogFactory(settings))
    acceptor.start()
    print("READY %d" % a.port, flush=True)
    try:
        # Runs until stdin closes (the test process ends) or a signal kills it.
        for line in sys.stdin:
            # QuickFIX's session thread counts an incoming message (next expected MsgSeqNum
            # + 1) after fromApp returns, outside our lock: a reset sent from this thread
            # right after the gateway's last message could be undone by that increment
            # ("MsgSeqNum too low, expecting 2"). Let the session thread finish first.
            time.sleep(0.3)
            with app.lock:
                command(app, line)
    finally:
        acceptor.stop()


if __name__ == "__main__":
    main()
