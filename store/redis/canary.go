package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// maxTagSearch bounds the candidate tags CanaryTags tries for each master:
// a few hundred find one for any master that serves a slot; more means
// that every key of the store hashes to one slot (a key prefix with a hash
// tag of its own).
const maxTagSearch = 1 << 16

// CanaryTags returns, on a Redis Cluster, one hash tag ("{c12}") for each
// master, whose slot that master serves for a key <prefix>mid{tag}...: a
// key built so lands on that master, and a canary under each watches every
// master, each of which can lose writes on its own (a failover to a lagging
// replica, an eviction). The masters are read from CLUSTER SLOTS at each
// call. Elsewhere (a single node, Sentinel) it returns nil: one place
// holds every key. When the key prefix holds a hash tag of its own, every
// key is on one master, and one tag is returned.
func (s *Store) CanaryTags(ctx context.Context, mid string) ([]string, error) {
	c, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redis store: cluster slots: %w", err)
	}
	owner := make([]int, clusterSlots) // slot → master's index + 1
	masters := map[string]int{}
	for _, r := range slots {
		if len(r.Nodes) == 0 {
			continue
		}
		addr := r.Nodes[0].Addr
		i, ok := masters[addr]
		if !ok {
			i = len(masters) + 1
			masters[addr] = i
		}
		for sl := max(r.Start, 0); sl <= min(r.End, clusterSlots-1); sl++ {
			owner[sl] = i
		}
	}
	found := make([]string, len(masters)+1)
	var tags []string
	for n := 0; n < maxTagSearch && len(tags) < len(masters); n++ {
		tag := "{c" + strconv.Itoa(n) + "}"
		m := owner[keySlot(s.prefix+mid+tag)]
		if m != 0 && found[m] == "" {
			found[m] = tag
			tags = append(tags, tag)
		}
		if n == 0 && strings.IndexByte(s.prefix+mid, '{') >= 0 && keySlot(s.prefix+mid+tag) == keySlot(s.prefix+mid+"{c1}") {
			break // the prefix's own tag decides: one master
		}
	}
	return tags, nil
}

// keySlot is Redis Cluster's hash slot of key: CRC16 of its hash tag (the
// part between the first '{' and the next '}', when not empty) or of the
// whole key.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % clusterSlots
}

// crc16 is CRC-16/XMODEM, the checksum of Redis Cluster's key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
