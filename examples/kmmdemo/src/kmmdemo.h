/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What kmmdemo exports to other modules, and the version both report.
 *
 * KMMDEMO_VERSION is given at build time as a bare token (KCFLAGS=
 * -DKMMDEMO_VERSION=2, the Dockerfile's build argument of that name), so that
 * one source builds v1 and v2 images; the token is made a string here (a
 * quoted define would lose its quotes on the way through make and the
 * shell). Digits and dots only: a word could be a macro of its own.
 */
#ifndef KMMDEMO_H
#define KMMDEMO_H

#ifndef KMMDEMO_VERSION
#error "build with KCFLAGS=-DKMMDEMO_VERSION=<version>, e.g. 1"
#endif
#define KMMDEMO_STRING(token) #token
#define KMMDEMO_EXPANDED_STRING(token) KMMDEMO_STRING(token)
#define KMMDEMO_VERSION_STRING KMMDEMO_EXPANDED_STRING(KMMDEMO_VERSION)

/*
 * kmmdemo_set_note() - the text every later read of a kmmdemo device shows
 * on its "peer:" line; NULL clears it, and at most 63 bytes are kept.
 * kmmdemo_peer calls it (EXPORT_SYMBOL_GPL), which makes kmmdemo_peer depend
 * on kmmdemo: the kernel refuses to load it alone, depmod writes the
 * dependency into modules.dep, and modprobe loads kmmdemo first.
 */
void kmmdemo_set_note(const char *note);

#endif /* KMMDEMO_H */
