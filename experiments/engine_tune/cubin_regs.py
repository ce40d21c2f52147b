"""Registers per kernel of a cubin, from its ELF (.nv.info EIATTR_REGCOUNT records, names from .symtab): what
ptxas allocated, without a GPU. kernel_regs(cubin_bytes) -> {kernel name: registers}."""
import struct
def sections(elf):
    shoff=struct.unpack_from('<Q',elf,0x28)[0]; shentsize,shnum,shstrndx=struct.unpack_from('<HHH',elf,0x3a)
    secs=[]
    for i in range(shnum):
        o=shoff+i*shentsize
        name,typ,flags,addr,off,size=struct.unpack_from('<IIQQQQ',elf,o)
        secs.append((name,off,size))
    stro=secs[shstrndx][1]
    def nm(n): e=elf.index(b'\0',stro+n); return elf[stro+n:e].decode()
    return [(nm(n),off,size) for n,off,size in secs]
def regcounts(elf):
    out={}
    for name,off,size in sections(elf):
        if name.startswith('.nv.info'):
            p=off
            while p<off+size:
                fmt,attr,sz=struct.unpack_from('<BBH',elf,p)
                if fmt==0x04:
                    if attr==0x2f: sym,reg=struct.unpack_from('<II',elf,p+4); out[sym]=reg
                    p+=4+sz
                elif fmt==0x03: p+=4
                elif fmt in (0x01,): p+=2
                elif fmt==0x02: p+=4
                else: p+=4+sz
    return out
def symnames(elf):
    secs=sections(elf)
    d={n:(o,s) for n,o,s in secs}
    so,ss=d['.symtab']; to,_=d['.strtab']
    out={}
    for i in range(ss//24):
        st_name=struct.unpack_from('<I',elf,so+24*i)[0]
        e=elf.index(b'\0',to+st_name); out[i]=elf[to+st_name:e].decode()
    return out
def kernel_regs(elf):
    n=symnames(elf); return {n.get(k,k):v for k,v in regcounts(elf).items()}
