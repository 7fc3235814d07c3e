#!/usr/bin/env bash
# Moves every IRQ of network interface $1 to the CPU list $2 (housekeeping cores), away from
# the shard cores, so a shard is not interrupted by packet processing of other queues.
# Usage: irq-affinity.sh eth0 0-1      Check: grep eth0 /proc/interrupts; cat /proc/irq/N/smp_affinity_list
# Stop irqbalance first (systemctl disable --now irqbalance), or it undoes this.
set -euo pipefail
dev=${1:?interface}; cpus=${2:?cpu list}
found=0
for irq in $(grep -E "[[:space:]]${dev}(-|$)" /proc/interrupts | cut -d: -f1 | tr -d ' '); do
  echo "$cpus" > "/proc/irq/$irq/smp_affinity_list"
  echo "irq $irq -> $(cat /proc/irq/$irq/smp_affinity_list)"
  found=1
done
[ "$found" = 1 ] || { echo "no IRQs named $dev in /proc/interrupts" >&2; exit 1; }
