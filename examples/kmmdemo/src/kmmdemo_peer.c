// SPDX-License-Identifier: GPL-2.0
/*
 * kmmdemo_peer: the example's second module, which uses a symbol kmmdemo
 * exports (kmmdemo_set_note). That use is the dependency: modpost records it
 * in this .ko, depmod writes "kmmdemo_peer.ko: kmmdemo.ko" into modules.dep,
 * modprobe loads kmmdemo first, and the kernel holds kmmdemo while this
 * module is loaded (/proc/modules: kmmdemo "used by" kmmdemo_peer).
 *
 * Its parameter "note" is what reads of kmmdemo's devices show on their
 * "peer:" line, so a workload sees the Module's modprobe.parameters reach
 * the kernel; unloading this module clears it.
 */
#include <linux/init.h>
#include <linux/kernel.h>
#include <linux/module.h>

#include "kmmdemo.h"

static char *note = "kmmdemo_peer";
module_param(note, charp, 0444);
MODULE_PARM_DESC(note, "Shown on the peer: line of every read of a kmmdemo device");

static int __init kmmdemo_peer_init(void)
{
	kmmdemo_set_note(note);
	pr_info("kmmdemo_peer: version %s, note \"%s\"\n", KMMDEMO_VERSION_STRING, note);
	return 0;
}

static void __exit kmmdemo_peer_exit(void)
{
	kmmdemo_set_note(NULL);
	pr_info("kmmdemo_peer: unloaded\n");
}

module_init(kmmdemo_peer_init);
module_exit(kmmdemo_peer_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kmm's example module that depends on kmmdemo");
MODULE_VERSION(KMMDEMO_VERSION_STRING);
