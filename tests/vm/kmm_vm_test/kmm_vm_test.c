// SPDX-License-Identifier: GPL-2.0
/*
 * The VM node test's module (tests/integration/test_vm_nodes.py): built for
 * each node kernel against its Debian headers by `make vm-test-modules`,
 * before pytest. Loading it says so in the kernel log with its parameter, so
 * the test sees the kernel ran this very build.
 */
#include <linux/init.h>
#include <linux/module.h>

static char *greeting = "unset";
module_param(greeting, charp, 0444);
MODULE_PARM_DESC(greeting, "Logged at load: the test's own token");

static int __init kmm_vm_test_init(void)
{
	pr_info("kmm_vm_test: loaded, greeting %s\n", greeting);
	return 0;
}

static void __exit kmm_vm_test_exit(void)
{
	pr_info("kmm_vm_test: unloaded\n");
}

module_init(kmm_vm_test_init);
module_exit(kmm_vm_test_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kmm VM node test module");
