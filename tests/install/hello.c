/* SPDX-License-Identifier: MIT */
/* Built against the installed kvtier through pkg-config by tests/install/install_test.sh: one
   sequence prefilled on the host backend and one token read back. */
#include <stdio.h>
#include <string.h>

#include <kvtier.h>

int main(void)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_manager *m = NULL;
	float k[2][64][16], v[2][64][16], rk[16], rv[16];
	int err;

	c.n_layers = 1;
	c.n_kv_heads = 2;
	c.n_q_heads = 2;
	c.head_dim = 16;
	c.block_tokens = 16;
	c.dtype = KVT_DTYPE_F32;
	c.sink_tokens = 4;
	c.recent_tokens = 16;
	c.topk_tokens = 0;
	c.device_bytes = 1 << 20;
	c.host_bytes = 1 << 20;
	c.backend = KVT_BACKEND_HOST;
	c.staging_bytes = 1 << 16;
	for (int h = 0; h < 2; h++)
		for (int t = 0; t < 64; t++)
			for (int d = 0; d < 16; d++) {
				k[h][t][d] = (float)(h * 1000 + t * 16 + d);
				v[h][t][d] = -k[h][t][d];
			}
	err = kvt_manager_create(&c, &m);
	if (!err)
		err = kvt_seq_create(m, 1, 64);
	if (!err)
		err = kvt_prefill_layer(m, 1, 0, k, v, NULL, NULL);
	if (!err)
		err = kvt_seq_read_token(m, 1, 0, 1, 33, rk, rv);
	if (err) {
		fprintf(stderr, "hello: %s (%s)\n", kvt_strerror(err),
			m ? kvt_manager_last_error(m) : "");
		kvt_manager_destroy(m);
		return 1;
	}
	err = memcmp(rk, k[1][33], sizeof(rk)) || memcmp(rv, v[1][33], sizeof(rv));
	printf("kvtier %s installed: token read back %s\n", kvt_version(), err ? "WRONG" : "ok");
	kvt_manager_destroy(m);
	return err;
}
