#![no_std] #![no_main]
