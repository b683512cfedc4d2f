/*
 * The MIG partition classes (issue 37) as NVIDIA's headers define them: one `name value` line
 * per constant, size and offset, held by tests/tests/abi_headers.rs to the test side's table
 * and the product's. Needs class/clc637.h and class/clc638.h vendored beside the others.
 */
#include <stddef.h>
#include <stdio.h>

#include "nvtypes.h"
#include "class/clc637.h"
#include "class/clc638.h"

#define V(name, value) printf("%s %llu\n", name, (unsigned long long)(value))
#define SIZE(mod, type) V(mod ".SIZE", sizeof(type))
#define OFF(mod, NAME, type, field) V(mod "." NAME, offsetof(type, field))

int main(void)
{
    V("class.SMC_PARTITION_REF", AMPERE_SMC_PARTITION_REF);
    V("class.SMC_EXEC_PARTITION_REF", AMPERE_SMC_EXEC_PARTITION_REF);

    SIZE("smc_partition", NVC637_ALLOCATION_PARAMETERS);
    OFF("smc_partition", "CAP_DESCRIPTOR", NVC637_ALLOCATION_PARAMETERS, capDescriptor);
    OFF("smc_partition", "SWIZZ_ID", NVC637_ALLOCATION_PARAMETERS, swizzId);
    V("smc_partition.DEVICE_PROFILING_SWIZZID", NVC637_DEVICE_PROFILING_SWIZZID);

    SIZE("smc_exec_partition", NVC638_ALLOCATION_PARAMETERS);
    OFF("smc_exec_partition", "CAP_DESCRIPTOR", NVC638_ALLOCATION_PARAMETERS, capDescriptor);
    OFF("smc_exec_partition", "EXEC_PARTITION_ID", NVC638_ALLOCATION_PARAMETERS, execPartitionId);
    return 0;
}
