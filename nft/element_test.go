package nft

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestElementsEncodeAsTheLibraryDoes: our element messages carry the same
// attributes as google/nftables' SetAddElements (less the set id it sends
// as 0), for every kind of named set the model has, and the read-back's
// decoder (elementIDs) turns them back into the same ids.
func TestElementsEncodeAsTheLibraryDoes(t *testing.T) {
	ipPort := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	cases := []struct {
		name  string
		spec  SetSpec
		elems []Element
	}{
		{"set", SetSpec{Key: nftables.TypeIPAddr}, []Element{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}}}},
		{"map of odd-length values", SetSpec{Key: nftables.TypeIPAddr, Data: ipPort}, []Element{
			{Key: []byte{172, 30, 0, 1}, Val: []byte{10, 1, 0, 1, 0, 0, 0x1f, 0x90}},
			{Key: []byte{172, 30, 0, 2}, Val: []byte{10, 1, 0, 2, 0, 0, 0x1f, 0x91, 7}},
		}},
		{"verdict map", SetSpec{Key: ipPort, Data: nftables.TypeVerdict}, []Element{
			{Key: []byte{172, 30, 0, 1, 0, 0, 0, 80}, Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "service-ABC-ns/svc/tcp/p80"}},
			{Key: []byte{172, 30, 0, 2, 0, 0, 0, 80}, Verdict: &expr.Verdict{Kind: expr.VerdictDrop}},
		}},
	}
	for _, c := range cases {
		var ids []string
		for _, e := range c.elems {
			ids = append(ids, e.ID())
		}
		// The read-back's decoder gives the ids back.
		var back []string
		elementIDs(appendElements(nil, testName, "m", c.spec, ids), func(id []byte) { back = append(back, string(id)) })
		if !slices.Equal(back, ids) {
			t.Errorf("%s: decoded ids %q, want %q", c.name, back, ids)
		}
		for _, del := range []bool{false, true} {
			var lib []netlink.Message
			enc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
				lib = append(lib, req[1:len(req)-1]...)
				return nil, io.EOF
			}))
			if err != nil {
				t.Fatal(err)
			}
			set := &nftables.Set{Table: &nftables.Table{Name: testName, Family: nftables.TableFamilyIPv4}, Name: "m"}
			var batch []nftables.SetElement
			for _, id := range ids {
				batch = append(batch, DecodeElement(id, c.spec))
			}
			if del {
				err = enc.SetDeleteElements(set, batch)
			} else {
				err = enc.SetAddElements(set, batch)
			}
			if err != nil || enc.Flush() != nil || len(lib) != 1 {
				t.Fatalf("%s: the library encoded %d messages, %v", c.name, len(lib), err)
			}
			want := attrs(t, lib[0].Data[4:])
			delete(want, unix.NFTA_SET_ELEM_LIST_SET_ID)
			got := attrs(t, appendElements(nil, testName, "m", c.spec, ids))
			if len(got) != len(want) {
				t.Errorf("%s (delete %v): attributes %v, want %v", c.name, del, keys(got), keys(want))
			}
			for typ, w := range want {
				if !bytes.Equal(got[typ], w) {
					t.Errorf("%s (delete %v): attribute %d is\n%x\nwant\n%x", c.name, del, typ, got[typ], w)
				}
			}
		}
	}
}

func attrs(t *testing.T, b []byte) map[uint16][]byte {
	t.Helper()
	out := map[uint16][]byte{}
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		t.Fatal(err)
	}
	for ad.Next() {
		out[ad.Type()] = ad.Bytes()
	}
	if err := ad.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func keys(m map[uint16][]byte) []uint16 {
	var out []uint16
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestIDBuilderBuildsElementIDsWithoutAllocating: ids built field by field
// are those of the Elements they stand for, in both families, and cost one
// allocation, the string.
func TestIDBuilderBuildsElementIDsWithoutAllocating(t *testing.T) {
	for _, c := range []struct{ vip, ep string }{{"172.30.0.1", "10.1.2.3"}, {"fd00:30::1", "fd00:10::2:3"}} {
		vip, ep := netip.MustParseAddr(c.vip), netip.MustParseAddr(c.ep)
		build := func() string {
			var buf [MaxIDLen]byte
			return NewID(buf[:0]).Addr(vip).Proto(unix.IPPROTO_TCP).Port(8080).Uint32(7).EndKey().Addr(ep).Port(9090).String()
		}
		key := slices.Concat(vip.AsSlice(), []byte{unix.IPPROTO_TCP, 0, 0, 0}, []byte{0x1f, 0x90, 0, 0}, binary.NativeEndian.AppendUint32(nil, 7))
		want := Element{Key: key, Val: slices.Concat(ep.AsSlice(), []byte{0x23, 0x82, 0, 0})}.ID()
		if got := build(); got != want {
			t.Errorf("%s → %s: id %x, want %x", vip, ep, got, want)
		}
		if n := testing.AllocsPerRun(100, func() { _ = build() }); n > 1 {
			t.Errorf("%s → %s: %v allocations per id, want 1", vip, ep, n)
		}
		verdict := NewID(nil).Addr(vip).EndKey().Verdict(expr.VerdictGoto, "chain").String()
		if want := (Element{Key: vip.AsSlice(), Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "chain"}}).ID(); verdict != want {
			t.Errorf("%s : goto chain: id %x, want %x", vip, verdict, want)
		}
		if got, want := NewID(nil).Addr(vip).Addr(ep).String(), (Element{Key: slices.Concat(vip.AsSlice(), ep.AsSlice())}).ID(); got != want {
			t.Errorf("%s . %s: id %x, want %x", vip, ep, got, want)
		}
	}
}
