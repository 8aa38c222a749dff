#!/bin/sh
# kbp-latency's [script]: tuned runs it with "start" when it applies the profile and with
# "stop" when it unapplies it (another profile, tuned stopping).
#   start: serve the devices of /etc/kbp/kbp.toml -- through kbp.service when systemd runs
#          the machine (its cgroup keeps what apply starts; reload when it is active, start
#          otherwise; nothing when kbp-watch.service converges already), else kbpctl apply
#   stop:  kbp off, every change restored -- systemctl stop kbp.service, else
#          kbpctl disable --all
# A missing /etc/kbp/kbp.toml is not an error: the profile is network-latency then.
CONFIG=/etc/kbp/kbp.toml
KBPCTL=${KBPCTL:-kbpctl}

say() { echo "kbp-latency: $*" >&2; }

systemd_runs() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

start() {
	if [ ! -f "$CONFIG" ]; then
		say "no $CONFIG: kbp serves nothing (the profile is network-latency)"
		return 0
	fi
	if systemd_runs; then
		if systemctl -q is-active kbp-watch.service; then
			return 0
		fi
		systemctl reload-or-restart kbp.service
	else
		"$KBPCTL" apply
	fi
}

stop() {
	if systemd_runs; then
		systemctl stop kbp.service kbp-watch.service
	else
		"$KBPCTL" disable --all
	fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
