/*
 * SPDX-FileCopyrightText: Copyright (c) 2017-2024 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 * SPDX-License-Identifier: MIT
 *
 * Permission is hereby granted, free of charge, to any person obtaining a
 * copy of this software and associated documentation files (the "Software"),
 * to deal in the Software without restriction, including without limitation
 * the rights to use, copy, modify, merge, publish, distribute, sublicense,
 * and/or sell copies of the Software, and to permit persons to whom the
 * Software is furnished to do so, subject to the following conditions:
 *
 * The above copyright notice and this permission notice shall be included in
 * all copies or substantial portions of the Software.
 *
 * THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 * IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 * FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL
 * THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 * LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
 * FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 * DEALINGS IN THE SOFTWARE.
 */

#pragma once

//
// This file was generated with FINN, an NVIDIA coding tool.
// Source file:      nvlimits.finn
//




/*
 * This is the maximum number of GPUs supported in a single system.
 */
#define NV_MAX_DEVICES                32

/*
 * This is the maximum number of subdevices within a single device.
 */
#define NV_MAX_SUBDEVICES             8

/*
 * This is the maximum length of the process name string.
 */
#define NV_PROC_NAME_MAX_LENGTH       100U

/*
 * This is the maximum number of heads per GPU.
 */
#define NV_MAX_HEADS                  4

/*
 * Maximum length of a MIG device UUID. It is a 36-byte UUID string plus a
 * 4-byte prefix and NUL terminator: 'M' 'I' 'G' '-' UUID '\0x0'
 */
#define NV_MIG_DEVICE_UUID_STR_LENGTH 41U
