// SPDX-License-Identifier: GPL-2.0
/*
 * kmmdemo: the out-of-tree module of kmm's example (examples/kmmdemo), a
 * stand-in for a device driver that a Module builds, signs and loads.
 *
 * - One character device per instance, /dev/kmmdemo0 ... /dev/kmmdemoN-1,
 *   N the parameter "devices" (default 2, at most 16), in the device class
 *   "kmmdemo" (/sys/class/kmmdemo/kmmdemoI: where kmm's DRA driver finds
 *   them). Mode 0444 (the class's devnode callback), so a workload that does
 *   not run as root may read its device; nothing may write to one.
 * - At load it requests the firmware file kmmdemo.bin from the kernel's
 *   firmware search path (/lib/firmware, where a Module's
 *   modprobe.firmwarePath copies its image's firmware first). Without it the
 *   load fails with -ENOENT and a line in the kernel log saying so: a driver
 *   whose device needs its firmware should not claim the device without it.
 * - Reading a device returns its index, the module's version (the build's
 *   KMMDEMO_VERSION, also /sys/module/kmmdemo/version), the note a peer
 *   module set through kmmdemo_set_note() (kmmdemo_peer's parameter "note")
 *   and the firmware's bytes:
 *
 *     index: 0
 *     version: 1
 *     peer: hello
 *     firmware: 31 bytes
 *     <the bytes of kmmdemo.bin>
 *
 * - While a device is open the module is in use and cannot be unloaded
 *   (the file holds a reference to it, through the cdev's owner).
 *
 * Builds against Debian bookworm's two kernel lines, 6.1 and 6.12: the two
 * kernel interfaces that changed between them are chosen by version below.
 */
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/err.h>
#include <linux/firmware.h>
#include <linux/fs.h>
#include <linux/init.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/version.h>

#include "kmmdemo.h"

#define KMMDEMO_NAME "kmmdemo"
#define KMMDEMO_FIRMWARE "kmmdemo.bin"
#define KMMDEMO_MAX_DEVICES 16
#define KMMDEMO_MAX_FIRMWARE 4096
#define KMMDEMO_NOTE_SIZE 64
#define KMMDEMO_MODE 0444

static unsigned int devices = 2;
module_param(devices, uint, 0444);
MODULE_PARM_DESC(devices, "Character devices to make, /dev/kmmdemo0 on (1 to 16; default 2)");

static dev_t kmmdemo_first;
static struct class *kmmdemo_class;
static struct cdev kmmdemo_cdev;
static unsigned int kmmdemo_made;
static u8 *kmmdemo_firmware;
static size_t kmmdemo_firmware_size;

static DEFINE_MUTEX(kmmdemo_note_lock);
static char kmmdemo_note[KMMDEMO_NOTE_SIZE];

void kmmdemo_set_note(const char *note)
{
	mutex_lock(&kmmdemo_note_lock);
	if (note)
		strscpy(kmmdemo_note, note, sizeof(kmmdemo_note));
	else
		kmmdemo_note[0] = '\0';
	mutex_unlock(&kmmdemo_note_lock);
}
EXPORT_SYMBOL_GPL(kmmdemo_set_note);

/* What one open file reads: made at open, so a read never takes a lock. */
struct kmmdemo_reading {
	size_t size;
	char text[];
};

#define KMMDEMO_HEADER "index: %u\nversion: %s\npeer: %s\nfirmware: %zu bytes\n"

static int kmmdemo_open(struct inode *inode, struct file *file)
{
	unsigned int index = iminor(inode);
	char note[KMMDEMO_NOTE_SIZE];
	struct kmmdemo_reading *reading;
	int header;

	if (file->f_mode & FMODE_WRITE)
		return -EPERM;
	mutex_lock(&kmmdemo_note_lock);
	strscpy(note, kmmdemo_note[0] ? kmmdemo_note : "(none)", sizeof(note));
	mutex_unlock(&kmmdemo_note_lock);
	header = snprintf(NULL, 0, KMMDEMO_HEADER, index, KMMDEMO_VERSION_STRING, note,
			  kmmdemo_firmware_size);
	/* One byte more for snprintf's NUL, overwritten by the firmware. */
	reading = kmalloc(struct_size(reading, text, header + 1 + kmmdemo_firmware_size),
			  GFP_KERNEL);
	if (!reading)
		return -ENOMEM;
	snprintf(reading->text, header + 1, KMMDEMO_HEADER, index, KMMDEMO_VERSION_STRING, note,
		 kmmdemo_firmware_size);
	memcpy(reading->text + header, kmmdemo_firmware, kmmdemo_firmware_size);
	reading->size = header + kmmdemo_firmware_size;
	file->private_data = reading;
	return 0;
}

static ssize_t kmmdemo_read(struct file *file, char __user *buffer, size_t count, loff_t *offset)
{
	struct kmmdemo_reading *reading = file->private_data;

	return simple_read_from_buffer(buffer, count, offset, reading->text, reading->size);
}

static int kmmdemo_release(struct inode *inode, struct file *file)
{
	kfree(file->private_data);
	return 0;
}

static const struct file_operations kmmdemo_fops = {
	.owner = THIS_MODULE,
	.open = kmmdemo_open,
	.read = kmmdemo_read,
	.release = kmmdemo_release,
};

/* The class's devnode callback takes a const device from 6.2 on. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
static char *kmmdemo_devnode(const struct device *dev, umode_t *mode)
#else
static char *kmmdemo_devnode(struct device *dev, umode_t *mode)
#endif
{
	if (mode)
		*mode = KMMDEMO_MODE;
	return NULL;
}

static int kmmdemo_load_firmware(void)
{
	const struct firmware *firmware;
	int err;

	/* No device yet: the file is looked for in the firmware search path only. */
	err = request_firmware(&firmware, KMMDEMO_FIRMWARE, NULL);
	if (err) {
		pr_err("kmmdemo: cannot load firmware %s (error %d): not loading; put it in the kernel's firmware search path, e.g. /lib/firmware/%s (a Module's modprobe.firmwarePath copies its image's files there)\n",
		       KMMDEMO_FIRMWARE, err, KMMDEMO_FIRMWARE);
		return err;
	}
	if (firmware->size > KMMDEMO_MAX_FIRMWARE) {
		pr_err("kmmdemo: firmware %s has %zu bytes, more than %d: not loading\n",
		       KMMDEMO_FIRMWARE, firmware->size, KMMDEMO_MAX_FIRMWARE);
		release_firmware(firmware);
		return -EFBIG;
	}
	/* kmalloc rather than kmemdup: an empty file is fine too. */
	kmmdemo_firmware = kmalloc(firmware->size + 1, GFP_KERNEL);
	if (kmmdemo_firmware) {
		memcpy(kmmdemo_firmware, firmware->data, firmware->size);
		kmmdemo_firmware_size = firmware->size;
	}
	release_firmware(firmware);
	return kmmdemo_firmware ? 0 : -ENOMEM;
}

static void kmmdemo_remove_devices(void)
{
	while (kmmdemo_made > 0) {
		kmmdemo_made--;
		device_destroy(kmmdemo_class, MKDEV(MAJOR(kmmdemo_first), kmmdemo_made));
	}
}

static int __init kmmdemo_init(void)
{
	struct device *device;
	int err;

	if (devices < 1 || devices > KMMDEMO_MAX_DEVICES) {
		pr_err("kmmdemo: devices=%u: must be 1 to %d\n", devices, KMMDEMO_MAX_DEVICES);
		return -EINVAL;
	}
	err = kmmdemo_load_firmware();
	if (err)
		return err;
	err = alloc_chrdev_region(&kmmdemo_first, 0, devices, KMMDEMO_NAME);
	if (err)
		goto free_firmware;
	/* class_create lost its module argument in 6.4. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	kmmdemo_class = class_create(KMMDEMO_NAME);
#else
	kmmdemo_class = class_create(THIS_MODULE, KMMDEMO_NAME);
#endif
	if (IS_ERR(kmmdemo_class)) {
		err = PTR_ERR(kmmdemo_class);
		goto unregister;
	}
	kmmdemo_class->devnode = kmmdemo_devnode;
	for (kmmdemo_made = 0; kmmdemo_made < devices; kmmdemo_made++) {
		device = device_create(kmmdemo_class, NULL,
				       MKDEV(MAJOR(kmmdemo_first), kmmdemo_made), NULL,
				       KMMDEMO_NAME "%u", kmmdemo_made);
		if (IS_ERR(device)) {
			err = PTR_ERR(device);
			goto remove_devices;
		}
	}
	/* Last: from here on a device can be opened, and nothing fails after. */
	cdev_init(&kmmdemo_cdev, &kmmdemo_fops);
	kmmdemo_cdev.owner = THIS_MODULE;
	err = cdev_add(&kmmdemo_cdev, kmmdemo_first, devices);
	if (err)
		goto remove_devices;
	pr_info("kmmdemo: version %s, %u device(s) with major %d, firmware %s (%zu bytes)\n",
		KMMDEMO_VERSION_STRING, devices, MAJOR(kmmdemo_first), KMMDEMO_FIRMWARE,
		kmmdemo_firmware_size);
	return 0;

remove_devices:
	kmmdemo_remove_devices();
	class_destroy(kmmdemo_class);
unregister:
	unregister_chrdev_region(kmmdemo_first, devices);
free_firmware:
	kfree(kmmdemo_firmware);
	return err;
}

static void __exit kmmdemo_exit(void)
{
	cdev_del(&kmmdemo_cdev);
	kmmdemo_remove_devices();
	class_destroy(kmmdemo_class);
	unregister_chrdev_region(kmmdemo_first, devices);
	kfree(kmmdemo_firmware);
	pr_info("kmmdemo: unloaded\n");
}

module_init(kmmdemo_init);
module_exit(kmmdemo_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kmm's example module: character devices that read back their firmware");
MODULE_VERSION(KMMDEMO_VERSION_STRING);
MODULE_FIRMWARE(KMMDEMO_FIRMWARE);
