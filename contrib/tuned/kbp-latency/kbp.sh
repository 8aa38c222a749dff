#!/bin/sh
# kbp-latency's [script]: tuned runs it with "start" when it applies the profile and with
# "stop" when it unapplies it (another profile, tuned stopping).
#   start: serve the devices of /etc/kbp/kbp.toml -- through kbp.service when systemd runs
#          the machine (its cgroup keeps what apply starts): reload when it is active, start
#          otherwise, nothing when kbp-watch.service converges already; without systemd
#          (a container, another init) kbpctl apply
#   stop:  kbp off, every change restored: systemctl stop kbp.service kbp-watch.service,
#          without systemd kbpctl disable --all
# The systemctl calls do not wait for the job (--no-block) while the system boots or shuts
# down: tuned.service and kbp.service start and stop in the same transaction then. A missing
# config is not an error: the profile is network-latency then. $KBP_CONFIG, $KBPCTL and
# $KBP_SYSTEMD_DIR replace the config's path, the command and /run/systemd/system (tests).
CONFIG=${KBP_CONFIG:-/etc/kbp/kbp.toml}
KBPCTL=${KBPCTL:-kbpctl}

say() { echo "kbp-latency: $*" >&2; }

systemd_runs() {
	[ -d "${KBP_SYSTEMD_DIR:-/run/systemd/system}" ] && command -v systemctl >/dev/null
}

# --no-block unless the system is up (running or degraded)
no_block() {
	case "$(systemctl is-system-running 2>/dev/null)" in
	running | degraded) ;;
	*) echo --no-block ;;
	esac
}

start() {
	if [ ! -f "$CONFIG" ]; then
		say "no $CONFIG: kbp serves nothing (the profile is network-latency)"
		return 0
	fi
	if ! systemd_runs; then
		"$KBPCTL" apply --config "$CONFIG"
	elif ! systemctl -q is-active kbp-watch.service; then
		systemctl $(no_block) reload-or-restart kbp.service
	fi
}

stop() {
	if systemd_runs; then
		systemctl $(no_block) stop kbp.service kbp-watch.service
	else
		"$KBPCTL" disable --all
	fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
